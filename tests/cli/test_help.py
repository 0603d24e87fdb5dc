"""`ddiloco run --help` a person can read (issue #45, item 5): the common flags in panels, under 120
lines on a 100-column terminal, and one line that points to `--help-all`, which lists every option
the command accepts. A flag the short help leaves out parses, and is refused, as any other."""

from __future__ import annotations

import dataclasses
import os
import re
import subprocess
import sys

import typer.main

from ddiloco.cli import _register, app
from ddiloco.cli._run_flags import RunCommand, RunFlags

_register()
PANELS = ("Run", "Algorithm", "Network", "Chaos", "Backends", "Output")


def ddiloco(*args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "DDILOCO_DEBUG"}
    env["COLUMNS"] = "100"
    return subprocess.run(
        [sys.executable, "-m", "ddiloco", *args], capture_output=True, text=True, timeout=120, env=env
    )


def run_command():  # noqa: ANN201 - typer carries its own copy of click's classes
    return typer.main.get_command(app).commands["run"]  # type: ignore[attr-defined]


def accepted() -> dict[str, object]:
    """Every option `ddiloco run` parses (--help and --help-all included), by its first name."""
    command = run_command()
    params = command.get_params(typer.Context(command))
    return {p.opts[0]: p for p in params if p.param_type_name == "option"}


def listed(help_text: str) -> list[str]:
    """The options a help shows: the first name on each row of its panels."""
    return re.findall(r"^│ (--[\w-]+)", help_text, flags=re.MULTILINE)


def panels(help_text: str) -> list[str]:
    return re.findall(r"^╭─ (\w+) ─", help_text, flags=re.MULTILINE)


def test_the_short_help_fits_a_screen_in_panels_and_points_to_help_all():
    out = ddiloco("run", "--help")
    assert out.returncode == 0, out.stderr
    lines = out.stdout.rstrip().splitlines()
    assert len(lines) < 120, f"{len(lines)} lines"
    assert panels(out.stdout) == [*PANELS, "Help"]
    assert "ddiloco run --help-all shows every option" in lines[-1]
    options = accepted()
    shown = {flag for flag, p in options.items() if p.name in RunCommand.common} | {"--help", "--help-all"}
    assert sorted(listed(out.stdout)) == sorted(shown)
    assert "--kill-every" not in out.stdout and "--sbatch-arg" not in out.stdout


def test_help_all_lists_every_option_run_accepts_in_its_panel():
    out = ddiloco("run", "--help-all")
    assert out.returncode == 0, out.stderr
    options = accepted()
    assert len(options) > 80
    assert sorted(listed(out.stdout)) == sorted(options)
    assert panels(out.stdout) == [*PANELS, "Help"]  # no option left in a panel of no name
    assert "shows every option" not in out.stdout
    assert {getattr(p, "rich_help_panel", None) for p in options.values()} == {*PANELS, "Help"}


def test_the_short_help_names_flags_of_the_command():
    fields = {f.name for f in dataclasses.fields(RunFlags)}
    assert RunCommand.common <= fields, RunCommand.common - fields
    short = {getattr(p, "rich_help_panel", None) for p in accepted().values() if p.name in RunCommand.common}
    assert short == set(PANELS)  # each panel shows its first few


def test_a_flag_left_out_of_the_short_help_parses_as_any_other():
    command = run_command()
    args = ["--kill-every", "2.5", "--codec-down", "int8", "--no-bulk-socket", "--sbatch-arg=--qos=x"]
    with command.make_context("run", args) as ctx:
        given = ctx.params
    assert (given["kill_every"], given["codec_down"].value, given["bulk_socket"]) == (2.5, "int8", False)
    assert given["sbatch_arg"] == ["--qos=x"]
    out = ddiloco("run", "--kill-every", "0")
    lines = out.stderr.strip().splitlines()
    assert out.returncode == 2 and len(lines) == 1, out.stderr
    assert lines[0].startswith("ddiloco run: error:") and "--kill-every" in lines[0]
