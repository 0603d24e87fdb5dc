"""A command whose flags are a dataclass (`cli/_flags.py`): typer builds from it the options the same
parameters in the function's own signature build, and the command gets the values as one object."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

import pytest
import typer
from typer.testing import CliRunner

from ddiloco.cli._flags import takes


@dataclass(frozen=True)
class Flags:
    where: Path = typer.Argument(..., help="Where.")
    count: int = typer.Option(3, "--count", "-n", min=1, max=9, help="How many.")
    name: str | None = typer.Option(None, help="A name.")
    items: list[str] | None = typer.Option(None, help="Repeatable.")
    fast: bool = typer.Option(True, help="On or off.")


def options_of(app: typer.Typer) -> list[str]:
    command = typer.main.get_command(app)
    skip = ("_runtime_param", "callback", "_custom_shell_complete")
    return [
        re.sub(r" at 0x[0-9a-f]+", "", repr({k: v for k, v in vars(p).items() if k not in skip}))
        for p in command.params
    ]


def test_a_dataclass_of_flags_makes_the_options_of_the_same_signature_and_one_object_of_the_values():
    got: list[Flags] = []
    by_flags, by_signature = typer.Typer(add_completion=False), typer.Typer(add_completion=False)

    @by_flags.command()
    @takes(Flags)
    def command(flags: Flags) -> None:
        """The help."""
        got.append(flags)

    @by_signature.command()
    def signature(
        where: Path = typer.Argument(..., help="Where."),
        count: int = typer.Option(3, "--count", "-n", min=1, max=9, help="How many."),
        name: str | None = typer.Option(None, help="A name."),
        items: list[str] | None = typer.Option(None, help="Repeatable."),
        fast: bool = typer.Option(True, help="On or off."),
    ) -> None:
        pass

    assert options_of(by_flags) == options_of(by_signature) and len(options_of(by_flags)) == 5
    assert typer.main.get_command(by_flags).help == "The help."
    done = CliRunner().invoke(by_flags, ["here", "-n", "4", "--items", "a", "--items", "b", "--no-fast"])
    assert done.exit_code == 0, done.output
    assert got == [Flags(where=Path("here"), count=4, name=None, items=["a", "b"], fast=False)]
    done = CliRunner().invoke(by_flags, ["here", "--count", "10"])
    assert done.exit_code == 2 and got[1:] == []  # the bounds are the option's


def test_flags_are_a_dataclass():
    class NotOne:
        count: int = typer.Option(3)

    with pytest.raises(TypeError, match="dataclass"):
        takes(NotOne)
