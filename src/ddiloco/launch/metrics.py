"""Metrics of a real run over time, for the run directory's metrics.jsonl (same schema as the
simulator's): the global model's eval loss (fetched read-only from the shards), the learners' training
loss, and tokens, merged tokens and goodput so far from the shards' status."""

from __future__ import annotations

import threading
import time
from collections import deque
from typing import TYPE_CHECKING

from ..learner.fetch import fetch_params
from ..records.rundir import MetricsLog
from ..train.tasks import Task
from .evaluate import evaluate_params

if TYPE_CHECKING:  # the supervisor is handed in; nothing of it is imported at run time
    from .supervisor import Supervisor


class RunMetrics:
    """A thread that records every `every` seconds until the supervisor stops; `latest` feeds the live view."""

    def __init__(
        self,
        sup: Supervisor,
        task: Task,
        metrics: MetricsLog,
        every: float,
        seed: int,
        token: str | None,
        eval_batches: int = 4,
    ) -> None:
        self.sup, self.task, self.metrics, self.every = sup, task, metrics, every
        self.seed, self.token, self.eval_batches = seed, token, eval_batches
        self.latest: dict = {"loss": None}
        self.history: deque[dict] = deque(maxlen=5000)  # eval and train points, for the dashboard's curves
        self._thread = threading.Thread(target=self._loop, name="ddiloco-run-metrics", daemon=True)

    def start(self) -> None:
        if self.every > 0:
            self._thread.start()

    def _loop(self) -> None:
        while not self.sup.stopping and not self.sup.interrupted.wait(self.every):
            self.record()

    def record(self) -> None:
        t = time.time() - self.sup.start_wall
        statuses = [s.status for s in self.sup.shards if s.status]
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
                goodput=min(1.0, useful / (self.sup.config.learners * elapsed)),
                tokens_merged=merged,
            )
        params = fetch_params([s.address for s in self.sup.shards if s.address], self.token)
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
