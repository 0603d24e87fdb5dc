"""How a text is dealt to the learners (`train.streams.SHARD_LAYOUTS`) is one setting, `--shard-layout`,
from every command that trains on shards to the task each process builds: `ddiloco run` -> each
learner's settings file -> its `LearnerSettings` -> `make_task`; `ddiloco learner` by hand; `ddiloco
sim`'s `SimConfig`; and `ddiloco run --method ddp` -> each worker's command line -> its task. A value
lost on the way fails here."""

from __future__ import annotations

import dataclasses

import pytest

from ddiloco.cli import _register, app, options
from ddiloco.cli import learner as learner_cli
from ddiloco.cli import run as run_cli
from ddiloco.cli import sim as sim_cli
from ddiloco.cli._run_flags import RunFlags
from ddiloco.cli.config_file import split_config
from ddiloco.dataparallel import worker as worker_module
from ddiloco.dataparallel.__main__ import parser as dataparallel_parser
from ddiloco.dataparallel.config import DataParallelConfig
from ddiloco.launch.config import RunConfig
from ddiloco.learner import trainer
from ddiloco.sim.config import SimConfig
from ddiloco.sim.run import build_task
from ddiloco.train.streams import SHARD_LAYOUTS

from .test_algorithm_reach import FakeTask, parse

_register()


class Built(Exception):
    """Raised by a stand-in `make_task` once it has seen what it was asked for."""


def capture(monkeypatch, module) -> dict:  # noqa: ANN001
    seen: dict = {}

    def make_task(*args, **kwargs):  # noqa: ANN002, ANN003
        seen.update(kwargs)
        raise Built

    monkeypatch.setattr(module, "make_task", make_task)
    return seen


def test_the_choices_are_the_layouts_and_the_default_is_the_first():
    assert [o.value for o in options.ShardLayout] == list(SHARD_LAYOUTS)
    assert options.plain(options.SHARD_LAYOUT.default)[0] == SHARD_LAYOUTS[0] == "interleaved"


@pytest.mark.parametrize("layout", [None, "contiguous", "interleaved"])
def test_run_gives_each_learner_its_layout_and_the_learner_builds_its_task_with_it(layout, tmp_path, monkeypatch):
    given = [] if layout is None else ["--shard-layout", layout]
    flags = parse(RunFlags, [*given, "--learners", "2", "--run-dir", str(tmp_path / "run")])
    run = run_cli._run_config(flags, FakeTask(), run_cli._chaos(flags))  # type: ignore[arg-type]
    assert run.shard_layout == (layout or "interleaved")
    args, settings = split_config(run.learner_args(1, ["127.0.0.1:7070"]), app)
    assert settings is not None
    learner = learner_cli.learner_settings(parse(learner_cli.LearnerFlags, args[1:], settings["learner"]))
    assert learner.shard_layout == (layout or "interleaved")
    seen = capture(monkeypatch, trainer)
    with pytest.raises(Built):
        trainer.train(dataclasses.replace(learner, state_dir=str(tmp_path / "state")))
    assert seen["shard_layout"] == (layout or "interleaved")


def test_a_learner_started_by_hand_takes_the_flag():
    base = ["--connect", "127.0.0.1:7070", "--id", "0"]
    assert learner_cli.learner_settings(parse(learner_cli.LearnerFlags, base)).shard_layout == "interleaved"
    flags = parse(learner_cli.LearnerFlags, [*base, "--shard-layout", "contiguous"])
    assert learner_cli.learner_settings(flags).shard_layout == "contiguous"


def test_sim_takes_the_flag_and_its_task_deals_the_text_so(monkeypatch, shakespeare):
    with monkeypatch.context() as m:
        m.setattr("ddiloco.sim.run.build_task", lambda config: FakeTask())
        config, _ = sim_cli._sim_config(parse(sim_cli.SimFlags, ["--fragments", "1", "--shard-layout", "contiguous"]))
        default, _ = sim_cli._sim_config(parse(sim_cli.SimFlags, ["--fragments", "1"]))
    assert (config.shard_layout, default.shard_layout) == ("contiguous", "interleaved")
    task = build_task(dataclasses.replace(config, data=shakespeare, model_size="tiny", seq_len=32))
    assert task.shard_layout == "contiguous"  # type: ignore[attr-defined]


def test_the_data_parallel_workers_build_their_task_with_it(tmp_path, monkeypatch):
    flags = parse(RunFlags, ["--shard-layout", "contiguous", "--method", "ddp", "--run-dir", str(tmp_path / "run")])
    config = run_cli._dataparallel_config(flags, run_cli._chaos(flags))
    assert config.shard_layout == "contiguous"
    args = vars(dataparallel_parser().parse_args(config.worker_command(0, 1234, 0.0)[3:]))
    fields = {f.name for f in dataclasses.fields(worker_module.WorkerSettings)}
    settings = worker_module.WorkerSettings(**{k: v for k, v in args.items() if k in fields})
    assert settings.shard_layout == "contiguous"
    seen = capture(monkeypatch, worker_module)
    with pytest.raises(Built):
        worker_module.Worker(settings)
    assert seen["shard_layout"] == "contiguous"


@pytest.mark.parametrize(
    "make",
    [
        lambda tmp: SimConfig(shard_layout="striped"),
        lambda tmp: RunConfig(run_dir=tmp, tokens=1000, shard_layout="striped"),
        lambda tmp: DataParallelConfig(run_dir=tmp, tokens=1000, shard_layout="striped"),
    ],
)
def test_an_unknown_layout_is_refused_where_the_config_is_made(make, tmp_path):
    with pytest.raises(ValueError, match="unknown shard layout 'striped'; choose one of interleaved, contiguous"):
        make(tmp_path)
