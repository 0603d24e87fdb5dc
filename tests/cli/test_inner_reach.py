"""The inner optimizer is one part of the settings tree (`train.inner.InnerConfig`, `RunConfig.inner`)
from every command that takes it to the optimizer a learner builds: `ddiloco run` -> each learner's
settings file -> the `InnerConfig` `ddiloco learner` builds; `ddiloco learner` by hand; `ddiloco sim`'s
`SimConfig.inner`. A value lost on the way fails here."""

from __future__ import annotations

from ddiloco.cli import app
from ddiloco.cli import learner as learner_cli
from ddiloco.cli import run as run_cli
from ddiloco.cli import sim as sim_cli
from ddiloco.cli._run_flags import RunFlags
from ddiloco.cli.config_file import split_config
from ddiloco.train.inner import InnerConfig

from .test_algorithm_reach import FakeTask, parse

# A value other than the default for each inner setting a flag gives, and the InnerConfig it makes.
GIVEN = ["--inner-lr", "0.001", "--batch-size", "8"]
WANT = InnerConfig(lr=0.001, batch_size=8)


def learner_inner(run_args: list[str], tmp_path) -> InnerConfig:  # noqa: ANN001
    """The `InnerConfig` learner 1 of `ddiloco run RUN_ARGS` builds, read from its settings file."""
    flags = parse(RunFlags, [*run_args, "--learners", "2", "--run-dir", str(tmp_path / "run")])
    run = run_cli._run_config(flags, FakeTask(), run_cli._chaos(flags))  # type: ignore[arg-type]
    child = run.learner_args(1, ["127.0.0.1:7070"])
    assert child[:2] == ["learner", "--config"]
    args, settings = split_config(child, app)
    assert settings is not None
    return learner_cli.learner_settings(parse(learner_cli.LearnerFlags, args[1:], settings["learner"])).inner


def test_the_values_differ_from_the_defaults():
    assert InnerConfig() != WANT


def test_run_gives_each_learner_the_inner_optimizer_through_its_settings_file(tmp_path):
    assert learner_inner(GIVEN, tmp_path) == WANT
    assert learner_inner([], tmp_path / "default") == InnerConfig()


def test_the_run_s_config_holds_the_inner_optimizer_as_a_part_of_its_tree(tmp_path):
    flags = parse(RunFlags, [*GIVEN, "--run-dir", str(tmp_path / "run")])
    run = run_cli._run_config(flags, FakeTask(), run_cli._chaos(flags))  # type: ignore[arg-type]
    assert run.inner == WANT
    settings = run.learner_settings(0)
    assert (settings["inner_lr"], settings["batch_size"]) == (0.001, 8)  # the learner's flags' names


def test_a_learner_started_by_hand_takes_the_same_flags():
    flags = parse(learner_cli.LearnerFlags, ["--connect", "127.0.0.1:7070", "--id", "0", *GIVEN])
    assert learner_cli.learner_settings(flags).inner == WANT


def test_sim_takes_the_same_flags(monkeypatch):
    monkeypatch.setattr("ddiloco.sim.run.build_task", lambda config: FakeTask())
    config, _ = sim_cli._sim_config(parse(sim_cli.SimFlags, ["--fragments", "1", *GIVEN]))
    assert config.inner == WANT
