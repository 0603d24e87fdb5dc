"""What `ddiloco run --backend slurm` records in its run directory, as a local run does (`local`), so
that `ddiloco report`, the benchmarks and `--json` read a Slurm run as they read a local one.

    config.json     at submission; its clock_origin is the submission's wall time
    metrics.jsonl   while the launcher follows the run: every --eval-every seconds `RunMetrics` (the
                    local recorder) evaluates the global model fetched from the shards at the
                    addresses in their address files (they move when a shard's job is requeued) and
                    writes eval, progress and train records; at the end, the final evaluation
    summary.json    at the end: `launch.summary.summarize` over the shared run directory (the shards'
                    event logs, the learners' journals) and the final checkpoint's eval loss

Everything comes from the shared run directory and the shards' Status, nothing from Slurm, so the
same numbers mean the same things on both backends. What only the local supervisor knows is taken
from the directory here: availability is learner-time inside a running learner process (from the
journals: a requeued job is down from its SIGTERM until its new process starts), learner restarts
are the learner processes beyond one per learner, shard restarts the shards' restores."""

from __future__ import annotations

import time
from collections.abc import Sequence
from pathlib import Path

from ..api.control import shard_status
from ..cluster import slurm
from ..launch.config import RunConfig
from ..launch.metrics import RunMetrics, RunView
from ..learner.journal import read_journals
from ..records.events import read_events
from ..records.intervals import union_length
from ..records.rundir import MetricsLog, RunDir
from ..records.sinks import Sink
from ..train.tasks import Task, make_task


def live_addresses(run_dir: Path, shards: int) -> list[str]:
    """Every shard's address, read again at every call; none while one is missing."""
    return slurm.shard_addresses(run_dir, shards) or []


def live_statuses(run_dir: Path, shards: int, token: str | None) -> list[dict]:
    """The Status of every shard that answers (a shard between two jobs does not)."""
    out = []
    for address in live_addresses(run_dir, shards):
        try:
            out.append(shard_status(address, token, timeout=5.0))
        except (ConnectionError, ValueError):
            continue
    return out


class SlurmRecord:
    """The run directory's records of one followed Slurm run (see the module docstring)."""

    def __init__(self, config: RunConfig, start_wall: float) -> None:
        self.config, self.start_wall = config, start_wall
        self.record = RunDir(config.run_dir)
        self.record.write_config("run", config, clock_origin=start_wall)
        self.log: MetricsLog | None = None  # opened by `start`: a detached run writes no metrics
        self.view = RunView(
            start_wall,
            config.learners,
            addresses=lambda: live_addresses(config.run_dir, config.sync_shards),
            statuses=lambda: live_statuses(config.run_dir, config.sync_shards, config.token),
            stopping=lambda: self.view.ended.is_set(),
        )
        self._task: Task | None = None
        self.metrics: RunMetrics | None = None

    def task(self) -> Task:
        """The run's task, built once (it reads the data) for every evaluation."""
        if self._task is None:
            c = self.config
            self._task = make_task(c.model, c.data, seq_len=c.seq_len, model_size=c.model_size)
        return self._task

    def start(self, sinks: Sequence[Sink] = ()) -> None:
        """Start recording metrics while the launcher follows the run (and to `sinks`: TensorBoard, wandb)."""
        import torch

        torch.set_num_threads(1)  # the launcher shares the submit host with whatever else runs there
        self.log = self.record.metrics(sinks)
        if self.config.eval_every > 0:
            self.metrics = RunMetrics(
                self.view,
                self.task(),
                self.log,
                self.config.eval_every,
                self.config.seed,
                self.config.token,
                self.config.eval_batches,
            )
            self.metrics.start()

    def finish(self, wall_seconds: float) -> tuple[dict, str | None]:
        """Stop recording, evaluate the final checkpoint, summarize; (result keys, error or None)."""
        from ..launch.evaluate import evaluate_checkpoints
        from ..launch.summary import summarize

        self.view.ended.set()
        if self.metrics is not None:
            self.metrics.join()
        log = self.log or self.record.metrics()
        c = self.config
        sync_dirs = [c.sync_dir(s) for s in range(c.sync_shards)]
        learner_dirs = [c.learner_dir(m) for m in range(c.learners)]
        stats = summarize(sync_dirs, learner_dirs, c.learners, time.time(), self.start_wall)
        error = None
        try:
            values = evaluate_checkpoints(self.task(), c.seed, sync_dirs, c.eval_batches)
        except (OSError, ValueError, KeyError) as exc:
            values, error = {"eval_loss": float("nan")}, f"could not evaluate the final checkpoint: {exc}"
        journals = [list(read_journals(d, "journal-*.json")) for d in learner_dirs]
        result = {
            **c.as_dict(),
            "model": c.model,
            "tokens": stats.pop("tokens"),
            **values,
            **stats,
            "availability": availability(journals, stats["window_start"], stats["window_stop"], c.learners),
            "wall_seconds": wall_seconds,
            "learner_restarts": max(0, sum(len(js) for js in journals) - c.learners),
            "synchronizer_restarts": sum(
                1 for d in sync_dirs for e in read_events(d / "events.jsonl") if e.get("kind") == "restored"
            ),
            "run_dir": str(c.run_dir),
        }
        log.write("eval", time.time() - self.start_wall, result["tokens"], **values)
        log.close()
        self.record.write_summary(result)
        return result, error


def availability(journals: list[list[dict]], start: float, stop: float, learners: int) -> float:
    """Share of the window's learner-time inside a running learner process: per learner, the union of
    its processes' spans (a journal spans one process, from its start to its last update)."""
    window = stop - start
    if window <= 0 or learners <= 0:
        return 0.0
    lived = 0.0
    for js in journals:
        spans = [(max(float(j.get("started", stop)), start), min(float(j.get("updated", start)), stop)) for j in js]
        lived += union_length([(a, b) for a, b in spans if b > a])
    return min(1.0, lived / (learners * window))
