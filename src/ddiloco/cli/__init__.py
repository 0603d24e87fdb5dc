"""The `ddiloco` command: one sub-command per module in this package."""

from __future__ import annotations

import os
import sys
from typing import NoReturn

import typer

from .config_file import apply_aliases, split_config

app = typer.Typer(
    name="ddiloco",
    help="Decoupled DiLoCo: resilient distributed pre-training.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)


def _print_version(value: bool) -> None:
    if value:
        from ..version import __version__

        typer.echo(f"ddiloco {__version__}")
        raise typer.Exit()


@app.callback()
def _root(
    version: bool = typer.Option(
        False, "--version", is_eager=True, callback=_print_version, help="Print the version and exit."
    ),
) -> None:
    """Decoupled DiLoCo: resilient distributed pre-training. Every command also takes
    --config FILE.toml (keys spelled like its flags; flags override the file)."""


def _register() -> None:
    """Import every sub-command module of this package; each registers itself on `app`."""
    import importlib
    import pkgutil

    for module in pkgutil.iter_modules(__path__):
        if not module.name.startswith("_") and module.name not in ("output", "options", "config_file"):
            importlib.import_module(f"{__name__}.{module.name}")


def _base(name: str) -> type[Exception]:
    """click's exception class `name` (typer vendors its own click and exports only some of them)."""
    return next(c for c in typer.BadParameter.__mro__ if c.__name__ == name)


_UsageError, _ClickException = _base("UsageError"), _base("ClickException")


def _refuse(command: str, message: str, code: int) -> NoReturn:
    """One line on stderr and the exit code: a refusal is read at a glance, never a box or a traceback."""
    typer.echo(f"{command}: error: {message}", err=True)
    sys.exit(code)


def main() -> None:
    """Runs the command line; a user's mistake is one line and exit code 2, an unexpected failure one
    line and exit code 1 (with DDILOCO_DEBUG=1, its traceback)."""
    _register()
    args = sys.argv[1:]
    command = " ".join(["ddiloco", *args[:1]]) if args and not args[0].startswith("-") else "ddiloco"
    try:
        args = apply_aliases(args)
        args, defaults = split_config(args, app)
    except ValueError as exc:
        _refuse(command, str(exc), 2)
    try:
        code = app(args=args, default_map=defaults, standalone_mode=False, prog_name="ddiloco")
    except _UsageError as exc:
        if type(exc).__name__ == "NoArgsIsHelpError":  # `ddiloco` alone: its help
            exc.show()  # type: ignore[attr-defined]  # click's UsageError has show()
            sys.exit(0)
        hint = "" if isinstance(exc, typer.BadParameter) else f" (see {command} --help)"
        _refuse(command, f"{exc.format_message()}{hint}", 2)  # type: ignore[attr-defined]  # as above
    except _ClickException as exc:
        _refuse(command, exc.format_message(), exc.exit_code)  # type: ignore[attr-defined]  # as above
    except (typer.Abort, KeyboardInterrupt):
        typer.echo("Aborted.", err=True)
        sys.exit(130)
    except Exception as exc:
        if os.environ.get("DDILOCO_DEBUG") == "1":
            raise
        _refuse(command, f"{type(exc).__name__}: {exc} (DDILOCO_DEBUG=1 shows the traceback)", 1)
    sys.exit(code if isinstance(code, int) else 0)
