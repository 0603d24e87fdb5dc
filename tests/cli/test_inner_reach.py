"""The inner optimizer is one part of the settings tree (`train.inner.InnerConfig`, `RunConfig.inner`)
from every command that takes it to the optimizer a learner builds: `ddiloco run` -> each learner's
settings file -> the `InnerConfig` `ddiloco learner` builds; `ddiloco learner` by hand; `ddiloco sim`'s
`SimConfig.inner`; and, for the options data-parallel training has too (Muon, the slow momentum),
`ddiloco run --method ddp` -> each worker's command line -> its `InnerConfig`. Each option is a flag
of one name in the panel of --inner-lr. A value lost on the way fails here."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest
import typer.main

from ddiloco.cli import _register, app, options
from ddiloco.cli import learner as learner_cli
from ddiloco.cli import run as run_cli
from ddiloco.cli import sim as sim_cli
from ddiloco.cli._run_flags import RunCommand, RunFlags
from ddiloco.cli.config_file import split_config
from ddiloco.dataparallel.__main__ import parser as dataparallel_parser
from ddiloco.dataparallel.worker import WorkerSettings
from ddiloco.train.inner import INNER_OPTIMIZERS, InnerConfig

from .test_algorithm_reach import FakeTask, parse

_register()
DEFAULT = InnerConfig()
# The InnerConfig fields that are flags (flag name: field), and the rest, which keep their defaults.
FLAGS = {
    "inner_lr": "lr",
    "batch_size": "batch_size",
    "inner_optimizer": "optimizer",
    "slow_momentum": "slow_momentum",
    "slow_weight": "slow_weight",
    "rewarm_steps": "rewarm_steps",
}
NOT_FLAGS = {"weight_decay", "beta1", "beta2", "warmup_steps", "min_lr_ratio", "grad_clip"}
# Muon (the default) and the slow momentum (AdamW's) exclude each other: two sets of values, every
# flagged field off its default.
GIVEN = {
    "muon": {"inner_lr": 0.001, "batch_size": 8, "rewarm_steps": 3},
    "slow": {
        "inner_lr": 0.002,
        "batch_size": 4,
        "inner_optimizer": "adamw",
        "slow_momentum": 0.99,
        "slow_weight": 0.25,
        "rewarm_steps": 5,
    },
}
COMMANDS = {"sim": sim_cli.SimFlags, "run": RunFlags, "learner": learner_cli.LearnerFlags}


def as_args(values: dict[str, Any]) -> list[str]:
    return [arg for name, value in values.items() for arg in (f"--{name.replace('_', '-')}", str(value))]


def want(values: dict[str, Any]) -> InnerConfig:
    return InnerConfig(**{FLAGS[name]: value for name, value in values.items()})


def learner_inner(run_args: list[str], tmp_path) -> InnerConfig:  # noqa: ANN001
    """The `InnerConfig` learner 1 of `ddiloco run RUN_ARGS` builds, read from its settings file."""
    flags = parse(RunFlags, [*run_args, "--learners", "2", "--run-dir", str(tmp_path / "run")])
    run = run_cli._run_config(flags, FakeTask(), run_cli._chaos(flags))  # type: ignore[arg-type]
    child = run.learner_args(1, ["127.0.0.1:7070"])
    assert child[:2] == ["learner", "--config"]
    args, settings = split_config(child, app)
    assert settings is not None
    return learner_cli.learner_settings(parse(learner_cli.LearnerFlags, args[1:], settings["learner"])).inner


def test_the_values_cover_every_flagged_field_off_its_default():
    fields = {f.name for f in dataclasses.fields(InnerConfig)}
    assert set(FLAGS.values()) | NOT_FLAGS == fields, "a new InnerConfig field needs a flag here, or a reason not to"
    covered = {name for values in GIVEN.values() for name in values}
    assert covered == set(FLAGS)
    for values in GIVEN.values():
        got = want(values)
        assert all(getattr(got, FLAGS[n]) != getattr(DEFAULT, FLAGS[n]) for n in values), values
    assert [o.value for o in options.InnerOptimizer] == list(INNER_OPTIMIZERS)


@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_each_option_is_a_flag_of_its_name_in_the_panel_of_inner_lr(command):
    cli = dict(typer.main.get_command(app).commands)[command]  # type: ignore[attr-defined]
    params = {p.name: p for p in cli.params if p.param_type_name == "option"}
    for name in FLAGS:
        assert f"--{name.replace('_', '-')}" in params[name].opts, (command, name)
        assert params[name].rich_help_panel == params["inner_lr"].rich_help_panel, (command, name)
        # --inner-lr's default is none: InnerConfig gives each optimizer its own (DEFAULT_LR)
        default = None if name == "inner_lr" else getattr(DEFAULT, FLAGS[name])
        assert options.plain(params[name].default)[0] == default, (command, name)


def test_run_s_short_help_leaves_the_options_to_help_all():
    assert not {"inner_optimizer", "slow_momentum", "slow_weight", "rewarm_steps"} & RunCommand.common


@pytest.mark.parametrize("case", sorted(GIVEN))
def test_run_gives_each_learner_the_inner_optimizer_through_its_settings_file(case, tmp_path):
    assert learner_inner(as_args(GIVEN[case]), tmp_path) == want(GIVEN[case])


def test_run_s_default_learners_build_the_default(tmp_path):
    assert learner_inner([], tmp_path) == DEFAULT


def test_the_run_s_config_holds_the_inner_optimizer_as_a_part_of_its_tree(tmp_path):
    flags = parse(RunFlags, [*as_args(GIVEN["muon"]), "--run-dir", str(tmp_path / "run")])
    run = run_cli._run_config(flags, FakeTask(), run_cli._chaos(flags))  # type: ignore[arg-type]
    assert run.inner == want(GIVEN["muon"])
    settings = run.learner_settings(0)
    assert (settings["inner_lr"], settings["batch_size"], settings["inner_optimizer"]) == (0.001, 8, "muon")


@pytest.mark.parametrize("case", sorted(GIVEN))
def test_a_learner_started_by_hand_takes_the_same_flags(case):
    flags = parse(learner_cli.LearnerFlags, ["--connect", "127.0.0.1:7070", "--id", "0", *as_args(GIVEN[case])])
    assert learner_cli.learner_settings(flags).inner == want(GIVEN[case])


@pytest.mark.parametrize("case", sorted(GIVEN))
def test_sim_takes_the_same_flags(case, monkeypatch):
    monkeypatch.setattr("ddiloco.sim.run.build_task", lambda config: FakeTask())
    config, _ = sim_cli._sim_config(parse(sim_cli.SimFlags, ["--fragments", "1", *as_args(GIVEN[case])]))
    assert config.inner == want(GIVEN[case])


@pytest.mark.parametrize("case", sorted(GIVEN))
def test_the_data_parallel_workers_build_the_same_optimizer(case, tmp_path):
    """Muon and the slow momentum reach a ddp baseline's workers too, so that a comparison is fair;
    the re-warm-up has no adoption to follow there and is refused."""
    given = {k: v for k, v in GIVEN[case].items() if k != "rewarm_steps"}
    flags = parse(RunFlags, [*as_args(given), "--method", "ddp", "--run-dir", str(tmp_path / "run")])
    config = run_cli._dataparallel_config(flags, run_cli._chaos(flags))
    assert config.inner == want(given)
    args = vars(dataparallel_parser().parse_args(config.worker_command(0, 1234, 0.0)[3:]))
    fields = {f.name for f in dataclasses.fields(WorkerSettings)}
    assert WorkerSettings(**{k: v for k, v in args.items() if k in fields}).inner == want(given)
    refused = parse(RunFlags, [*as_args(GIVEN[case]), "--method", "ddp", "--run-dir", str(tmp_path / "r2")])
    with pytest.raises(ValueError, match="--rewarm-steps"):
        run_cli._dataparallel_config(refused, run_cli._chaos(refused))


def test_a_bad_combination_is_the_command_s_error(tmp_path):
    flags = parse(RunFlags, ["--inner-optimizer", "muon", "--slow-momentum", "0.99", "--run-dir", str(tmp_path)])
    with pytest.raises(ValueError, match="slow_momentum"):
        run_cli._run_config(flags, FakeTask(), run_cli._chaos(flags))  # type: ignore[arg-type]


def test_sim_refuses_the_re_warm_up_where_nothing_is_adopted(monkeypatch):
    monkeypatch.setattr("ddiloco.sim.run.build_task", lambda config: FakeTask())
    config, _ = sim_cli._sim_config(parse(sim_cli.SimFlags, ["--method", "ddp", "--inner-optimizer", "muon"]))
    assert config.inner.optimizer == "muon"  # data-parallel takes Muon (and the slow momentum) ...
    with pytest.raises(typer.BadParameter, match="--rewarm-steps"):  # ... but no adoption to warm up after
        sim_cli._sim_config(parse(sim_cli.SimFlags, ["--method", "ddp", "--rewarm-steps", "3"]))
