"""A command's flags declared once, as the fields of a frozen dataclass, so that the command takes one
object instead of dozens of parameters:

    @dataclass(frozen=True)
    class RunFlags:
        learners: int = options.LEARNERS
        seed: int = typer.Option(0, help="...")

    @app.command("run")
    @takes(RunFlags)
    def run(flags: RunFlags) -> None: ...

`takes` gives typer a signature made of the fields (their names, types and `typer.Option` defaults,
in their order: --help lists them so), and calls the command with `RunFlags(**values)`. What typer
builds from it (the options, --help, --config's keys) is what the same parameters in the function's
own signature built.
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
import typing
from collections.abc import Callable
from typing import Any, TypeVar

F = TypeVar("F")


def takes(flags: type[F]) -> Callable[[Callable[[F], None]], Callable[..., None]]:
    """Make `command(flags: F)` a function of `F`'s fields, as typer reads them (see the module docstring)."""
    if not dataclasses.is_dataclass(flags):
        raise TypeError(f"{flags.__name__}: the flags of a command are a dataclass")
    hints = typing.get_type_hints(flags)
    parameters = [
        inspect.Parameter(f.name, inspect.Parameter.KEYWORD_ONLY, default=f.default, annotation=hints[f.name])
        for f in dataclasses.fields(flags)
    ]

    def decorate(command: Callable[[F], None]) -> Callable[..., None]:
        @functools.wraps(command)
        def from_values(**values: Any) -> None:
            command(flags(**values))

        del from_values.__wrapped__  # typer reads the signature below, not the command's own
        signature = inspect.Signature(parameters, return_annotation=None)
        from_values.__signature__ = signature  # type: ignore[attr-defined]  # what inspect.signature returns
        from_values.__annotations__ = {p.name: p.annotation for p in parameters}
        return from_values

    return decorate
