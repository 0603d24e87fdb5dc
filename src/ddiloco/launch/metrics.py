"""Metrics of a real run over time, for the run directory's metrics.jsonl (same schema as the
simulator's): the global model's eval loss (fetched read-only from the shards), the learners' training
loss, and tokens, merged tokens and goodput so far from the shards' status.

`RunMetrics` reads the run through a `RunView`, a few callables, not through the local supervisor:
the same recorder follows a run on this machine (`backends/local.py`) and one whose shards are Slurm jobs
(`backends/slurm.py`), so both write the same records on the same time origin."""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

from ..learner.fetch import fetch_params
from ..records.rundir import MetricsLog
from ..train.tasks import Task
from .evaluate import evaluate_params


@dataclass
class RunView:
    """What the recorder needs of a run: `t` counts from `start_wall` (the config's clock_origin);
    `addresses` and `statuses` are asked at every record (shards move); `ended`, once set, ends the
    loop without waiting out its period."""

    start_wall: float
    learners: int
    addresses: Callable[[], list[str]]
    statuses: Callable[[], list[dict]]
    stopping: Callable[[], bool]
    ended: threading.Event = field(default_factory=threading.Event)


class RunMetrics:
    """A thread that records every `every` seconds until the run stops; `latest` feeds the live view."""

    def __init__(
        self,
        view: RunView,
        task: Task,
        metrics: MetricsLog,
        every: float,
        seed: int,
        token: str | None,
        eval_batches: int,  # the run's --eval-batches: the curve on the final evaluation's yardstick
    ) -> None:
        self.view, self.task, self.metrics, self.every = view, task, metrics, every
        self.seed, self.token, self.eval_batches = seed, token, eval_batches
        self.latest: dict = {"loss": None}
        self.history: deque[dict] = deque(maxlen=5000)  # eval and train points, for the dashboard's curves
        self._thread = threading.Thread(target=self._loop, name="ddiloco-run-metrics", daemon=True)

    def start(self) -> None:
        if self.every > 0:
            self._thread.start()

    def join(self, wait: float = 60.0) -> None:
        """Once the view's `ended` is set: wait (bounded) for a record in progress, so that the
        caller's final record comes last."""
        if self._thread.is_alive():
            self._thread.join(wait)

    def _loop(self) -> None:
        while not self.view.stopping() and not self.view.ended.wait(self.every):
            self.record()

    def record(self) -> None:
        t = time.time() - self.view.start_wall
        statuses = self.view.statuses()
        tokens = max((st.get("tokens_reported", 0) for st in statuses), default=0)
        losses = [
            info["loss"]
            for st in statuses[:1]
            for info in st.get("learners", {}).values()
            if isinstance(info.get("loss"), (int, float))
        ]
        if losses:
            self._write("train", t, tokens, train_loss=sum(losses) / len(losses))
        if statuses:
            useful = sum(st.get("useful_seconds", 0.0) for st in statuses)
            elapsed = max(1e-9, time.time() - min(st.get("started_wall", time.time()) for st in statuses))
            merged = sum(st.get("tokens_merged", 0.0) for st in statuses)
            self.metrics.write(
                "progress",
                t,
                tokens,
                goodput=min(1.0, useful / (self.view.learners * elapsed)),
                tokens_merged=merged,
            )
        addresses = self.view.addresses()
        params = fetch_params(addresses, self.token) if addresses else None
        if params is not None:
            try:
                values = evaluate_params(self.task, self.seed, params, max_batches=self.eval_batches)
            except ValueError:
                return
            self.latest["loss"] = values["eval_loss"]
            self._write("eval", t, tokens, **values)

    def _write(self, kind: str, t: float, tokens: int, **values: float) -> None:
        self.metrics.write(kind, t, tokens, **values)
        self.history.append({"kind": kind, "t": t, "tokens": tokens, **values})
