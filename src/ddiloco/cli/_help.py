"""A command whose `--help` shows its common options and `--help-all` every one.

`ddiloco run` takes over eighty flags. Its `--help` lists the few a person starts with, each in its
panel (typer's `rich_help_panel`: Run, Algorithm, Network, Chaos, Backends, Output) and ends with one
line that points to `--help-all`, which prints every option in the same panels and exits. What is left
out of the short help is only left out of it: every option parses, is read from `--config` and is
checked the same whichever help shows it (the click parameters themselves are never hidden).

    class RunCommand(ShortHelp):
        common = frozenset({"learners", "tokens", ...})  # parameter names

    @app.command("run", cls=RunCommand)
"""

from __future__ import annotations

import copy
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, ClassVar

import typer
from typer.core import TyperCommand

HELP_ALL = "--help-all"
_ALL = "ddiloco.help_all"  # ctx.meta: the help being printed is the whole one
HELP_PANEL = "Help"


def _print_all(ctx: Any, _param: Any, value: bool) -> None:
    """--help-all: the help with every option, then exit 0 (as --help does)."""
    if value and not ctx.resilient_parsing:
        ctx.meta[_ALL] = True
        typer.echo(ctx.get_help(), color=ctx.color)
        ctx.exit()


class ShortHelp(TyperCommand):
    """`--help`: the options named in `common` (parameter names) and one line on `--help-all`;
    `--help-all`: every option. (ctx, formatter and the parameters are Any: typer carries its own
    copy of click's classes.)"""

    common: ClassVar[frozenset[str]] = frozenset()
    _help_all: Any = None

    def get_params(self, ctx: Any) -> list[Any]:
        params = super().get_params(ctx)
        help_option = self.get_help_option(ctx)
        if help_option is None:
            return params
        if self._help_all is None:  # --help's twin (one object: click orders eager options by identity)
            every = copy.copy(help_option)
            every.opts, every.secondary_opts, every.name = [HELP_ALL], [], "help_all"
            every.callback, every.help = _print_all, "Show every option (--help shows the common ones) and exit."
            self._help_all = every
        for option in (help_option, self._help_all):  # last, in a panel of their own
            option.rich_help_panel = HELP_PANEL
        return [*params, self._help_all]

    def format_help(self, ctx: Any, formatter: Any) -> None:
        if ctx.meta.get(_ALL):
            return super().format_help(ctx, formatter)
        with self._short(ctx):
            return super().format_help(ctx, formatter)

    @contextmanager
    def _short(self, ctx: Any) -> Iterator[None]:
        """While the short help is written: the rare options hidden, the line on --help-all its epilog."""
        rare: list[Any] = [p for p in self.params if p.param_type_name == "option" and p.name not in self.common]
        rare, epilog = [p for p in rare if not p.hidden], self.epilog
        for param in rare:
            param.hidden = True
        self.epilog = f"{ctx.command_path} {HELP_ALL} shows every option ({len(rare)} more)."
        try:
            yield
        finally:
            for param in rare:
                param.hidden = False
            self.epilog = epilog
