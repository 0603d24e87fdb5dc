"""Metrics over a simulated run: the global model's eval loss, the learners' training loss, goodput.

Hooked into a driver's per-step progress callback, it writes a line at each of `points` evenly spaced
token counts. Evaluations run on a copy of the global parameters and under a forked RNG, so
recording never changes the run it records.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from ..records.rundir import MetricsLog
from ..train.tasks import Task

Progress = Callable[[float, dict], None]


class SimRecorder:
    def __init__(
        self,
        metrics: MetricsLog,
        task: Task,
        total_tokens: int,
        points: int = 20,
        eval_batches: int = 20,
        forward: Progress | None = None,
    ) -> None:
        self.metrics, self.task, self.total = metrics, task, max(1, total_tokens)
        self.points, self.eval_batches, self.forward = max(1, points), eval_batches, forward
        self.driver: Any = None  # set once the driver exists: it evaluates driver.global_model()
        self._next = 1
        self._losses: list[float] = []
        self._last_tokens = -1.0

    def __call__(self, fraction: float, info: dict) -> None:
        if self.forward is not None:
            self.forward(fraction, info)
        if "loss" in info:
            self._losses.append(float(info["loss"]))
        tokens = info.get("tokens", fraction * self.total)
        if self._next <= self.points and tokens >= self._next * self.total / self.points:
            self._next = int(tokens * self.points / self.total) + 1
            self.record(float(info.get("time", 0.0)), tokens)

    def finish(self, t: float, tokens: float) -> None:
        """The end of the run, unless the last point already was."""
        if tokens > self._last_tokens:
            self.record(t, tokens)

    def record(self, t: float, tokens: float) -> None:
        self._last_tokens = tokens
        if self._losses:
            self.metrics.write("train", t, tokens, train_loss=sum(self._losses) / len(self._losses))
            self._losses.clear()
        if self.driver is None:
            return
        with torch.random.fork_rng(devices=[]):
            values = self.task.evaluate(self.driver.global_model(), max_batches=self.eval_batches)
        self.metrics.write("eval", t, tokens, **values, eval_batches=self.eval_batches)
        summary = self.driver.ledger.summary(t) if t > 0 else None
        if summary is not None:
            self.metrics.write(
                "progress",
                t,
                tokens,
                goodput=summary["goodput"],
                uptime=summary["uptime"],
                tokens_merged=summary["tokens_merged"],
            )
