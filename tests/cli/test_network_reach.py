"""The emulated link is one setting tree (`learner.wan.LinkConfig`, ms and MB/s) from every command that
takes it to the part that charges it: `ddiloco run` -> its learners' settings files -> each learner's
link layer, and -> the data-parallel workers' all-reduce; `ddiloco learner` by hand; `ddiloco sim`'s
link model (tests/cli/test_sim_cli.py). A value lost or converted twice on the way fails here."""

from __future__ import annotations

from ddiloco.cli import app
from ddiloco.cli import learner as learner_cli
from ddiloco.cli import run as run_cli
from ddiloco.cli._run_flags import RunFlags
from ddiloco.cli.config_file import split_config
from ddiloco.learner.wan import LinkConfig

from .test_algorithm_reach import FakeTask, parse

LINK = ["--net-latency", "20", "--net-bandwidth", "5", "--net-jitter", "3"]
WANT = LinkConfig(latency_ms=20.0, bandwidth_mb_s=5.0, jitter_ms=3.0)


def test_run_gives_each_learner_the_link_through_its_settings_file(tmp_path):
    flags = parse(RunFlags, [*LINK, "--learners", "2", "--run-dir", str(tmp_path / "run")])
    run = run_cli._run_config(flags, FakeTask(), run_cli._chaos(flags))  # type: ignore[arg-type]
    assert run.network.link == WANT
    child = run.learner_args(1, ["127.0.0.1:7070"])
    assert child[:2] == ["learner", "--config"]
    args, settings = split_config(child, app)
    assert settings is not None
    got = learner_cli.learner_settings(parse(learner_cli.LearnerFlags, args[1:], settings["learner"]))
    assert got.wan == WANT and got.learner == 1
    assert (got.wan.latency, got.wan.bytes_per_second, got.wan.jitter) == (0.02, 5e6, 0.003)  # what WanLink charges


def test_a_learner_started_by_hand_takes_the_same_flags():
    flags = parse(learner_cli.LearnerFlags, ["--connect", "127.0.0.1:7070", "--id", "0", *LINK])
    assert learner_cli.learner_settings(flags).wan == WANT


def test_the_data_parallel_baselines_charge_the_same_link(tmp_path):
    flags = parse(RunFlags, [*LINK, "--method", "ddp", "--run-dir", str(tmp_path / "run")])
    config = run_cli._dataparallel_config(flags, run_cli._chaos(flags))
    assert config.link == WANT
    command = config.worker_command(0, 0, 1234)
    assert [command[command.index(f) + 1] for f in ("--net-latency", "--net-bandwidth", "--net-jitter")] == [
        "20.0",
        "5.0",
        "3.0",
    ]
