"""Every `AlgorithmConfig` field is reachable from `ddiloco sim`, `ddiloco run` and `ddiloco synchronizer`
under one name (issue #43, item 1): the flag `--field-name`, in the Algorithm panel, whose value reaches
the algorithm the command runs; or, for a field a documented rule derives from another flag, that flag
(`DERIVED`, checked here as well). What "reaches" means per command: `ddiloco sim`'s `SimConfig`
(the algorithm its core runs), `ddiloco synchronizer`'s algorithm (`algorithm_of`, what its service is
built with), and `ddiloco run`'s synchronizer child: its command line, as `ddiloco synchronizer` parses
it. A new field without a flag, or a flag whose value stops on the way, fails here."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import pytest
import torch
import typer
import typer.main
from typer.testing import CliRunner

from ddiloco.cli import _register, app
from ddiloco.cli import run as run_cli
from ddiloco.cli import sim as sim_cli
from ddiloco.cli import synchronizer as sync_cli
from ddiloco.cli._flags import takes
from ddiloco.cli._run_flags import RunCommand, RunFlags
from ddiloco.cli.config_file import split_config
from ddiloco.cli.options import ALGORITHM
from ddiloco.core.config import AlgorithmConfig

_register()
COMMANDS = {"sim": sim_cli.SimFlags, "run": RunFlags, "synchronizer": sync_cli.SynchronizerFlags}
FIELDS = [f.name for f in dataclasses.fields(AlgorithmConfig)]
DEFAULT = AlgorithmConfig()

# A value other than the default for every field that is a flag of its own name; given all at once.
GIVEN: dict[str, Any] = {
    "fragments": 3,
    "sync_every": 12,
    "overlap": 3,
    "quorum": 2,
    "grace": 0.5,
    "outer_lr": 0.3,
    "outer_momentum": 0.25,
    "merge": "mean",
    "ema": 0.4,
    "max_outer_norm_ratio": 5.0,
    "final_momentum": True,
    "arrival": "rebase",
    "late": "refuse",
    "max_staleness": 7,
    "staleness_discount": 0.5,
    "outer_debias": True,
    "outer_restart_every": 5,
    "outer_lr_per_learner": 0.5,
    "stale_correction": True,
}

# The fields a documented rule derives from another flag: field -> (that flag, {its value: the field's}).
DERIVED: dict[str, tuple[str, dict[str, Any]]] = {
    # core.methods.fixed_knobs: the synchronous methods wait past tau (docs/algorithm.md, "Methods")
    "synchronous": ("--method", {"decoupled": False, "streaming": True, "diloco": True}),
    # options.parse_overlap: --overlap auto widens tau by each learner's link; a number fixes it
    "overlap_auto": ("--overlap", {"auto": True, "3": False}),
}
TENSORS = 8  # the fake model's parameter tensors (P is fitted to them)


def as_args(values: dict[str, Any]) -> list[str]:
    """--field-name VALUE per field; a switch --field-name or --no-field-name."""
    args = []
    for name, value in values.items():
        flag = name.replace("_", "-")
        args += [f"--{flag}" if value else f"--no-{flag}"] if isinstance(value, bool) else [f"--{flag}", str(value)]
    return args


def commands() -> dict[str, Any]:
    return dict(typer.main.get_command(app).commands)  # type: ignore[attr-defined]


def parse(flags: type, args: list[str], default_map: dict | None = None) -> Any:
    """The flags object a command of `flags` gets from `args` (the same options: `_flags.takes`), with
    `default_map` the settings of a `--config` file (`cli.config_file`)."""
    got: list[Any] = []
    probe = typer.Typer(add_completion=False)

    @probe.command()
    @takes(flags)
    def command(values: Any) -> None:
        got.append(values)

    done = CliRunner().invoke(probe, args, default_map=default_map)
    assert done.exit_code == 0, done.output
    return got[0]


class FakeTask:
    embedding_names: frozenset[str] = frozenset()

    def build_model(self, seed: int) -> torch.nn.Module:
        return torch.nn.Sequential(*[torch.nn.Linear(2, 2) for _ in range(TENSORS // 2)])


def algorithm_of(command: str, args: list[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> AlgorithmConfig:
    """The algorithm `ddiloco COMMAND ARGS` runs: the simulator's, the shard's, or (`run`) the one its
    synchronizer child builds from the command line the run gives it."""
    if command == "sim":
        monkeypatch.setattr("ddiloco.sim.run.build_task", lambda config: FakeTask())
        config, _ = sim_cli._sim_config(parse(sim_cli.SimFlags, args))
        assert config.algorithm == config.effective_algorithm()  # what the core gets
        return config.algorithm
    if command == "run":
        flags = parse(RunFlags, [*args, "--run-dir", str(tmp_path / "run")])
        run = run_cli._run_config(flags, FakeTask(), run_cli._chaos(flags))  # type: ignore[arg-type]
        child = run.synchronizer_args(0, 0)  # its settings in a file (`--config`), read as the child reads it
        assert child[0] == "synchronizer"
        args, settings = split_config(child, app)
        assert settings is not None
        return sync_cli.algorithm_of(parse(sync_cli.SynchronizerFlags, args[1:], settings["synchronizer"]), TENSORS)
    return sync_cli.algorithm_of(parse(sync_cli.SynchronizerFlags, args), TENSORS)


def test_the_values_are_set_apart_from_the_defaults_and_cover_every_field():
    assert set(GIVEN) | set(DERIVED) == set(FIELDS), "a new AlgorithmConfig field needs a flag here (and a value)"
    assert not set(GIVEN) & set(DERIVED)
    same = [name for name, value in GIVEN.items() if getattr(DEFAULT, name) == value]
    assert not same, f"give these a value other than the default, or the test cannot see it lost: {same}"
    AlgorithmConfig(**GIVEN)  # a valid config


@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_every_field_is_a_flag_of_its_own_name_in_the_algorithm_panel(command):
    cli = commands()[command]
    options = {p.name: p for p in cli.params if p.param_type_name == "option"}
    assert set(options) == {f.name for f in dataclasses.fields(COMMANDS[command])}  # what `parse` reads
    for name in GIVEN:
        assert name in options, f"ddiloco {command} has no flag for AlgorithmConfig.{name}"
        assert f"--{name.replace('_', '-')}" in options[name].opts, (command, name, options[name].opts)
        assert options[name].rich_help_panel == ALGORITHM, (command, name)
    for flag, _ in DERIVED.values():
        assert any(flag in p.opts for p in options.values()), (command, flag)


def test_the_outer_step_options_are_left_out_of_run_s_short_help():
    new = {
        "outer_debias",
        "outer_restart_every",
        "outer_lr_per_learner",
        "ema",
        "max_outer_norm_ratio",
        "stale_correction",
    }
    assert not new & RunCommand.common


@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_every_flag_s_value_reaches_the_algorithm(command, tmp_path, monkeypatch):
    algorithm = algorithm_of(command, as_args(GIVEN), tmp_path, monkeypatch)
    lost = {
        name: (value, getattr(algorithm, name)) for name, value in GIVEN.items() if getattr(algorithm, name) != value
    }
    assert not lost, f"ddiloco {command}: given -> got {lost}"


@pytest.mark.parametrize("command", sorted(COMMANDS))
@pytest.mark.parametrize("field", sorted(DERIVED))
def test_a_derived_field_follows_its_flag(command, field, tmp_path, monkeypatch):
    flag, rule = DERIVED[field]
    for value, expected in rule.items():
        algorithm = algorithm_of(command, ["--fragments", "1", flag, value], tmp_path / value, monkeypatch)
        assert getattr(algorithm, field) == expected, (command, flag, value)


def test_run_refuses_a_bad_algorithm_value_itself(tmp_path):
    """Not its synchronizer child at start: `ddiloco run` builds the same algorithm first (a ValueError
    there is the command's one-line error, exit code 2)."""
    flags = parse(RunFlags, ["--ema", "0", "--run-dir", str(tmp_path / "run")])
    with pytest.raises(ValueError, match=r"ema must be in \(0, 1\]"):
        run_cli._run_config(flags, FakeTask(), run_cli._chaos(flags))  # type: ignore[arg-type]
    assert not (tmp_path / "run").exists()
