"""Synchronous data-parallel baselines on the same virtual clock, data shards and hardware model.

One model; each step every participating learner computes on its own batch, the gradients are
averaged (all-reduce), and the step takes as long as the slowest participant plus the all-reduce.

- ``ddp`` (not elastic): when any learner is down, the whole job stalls until it is back; a step
  that a failure interrupts is lost.
- ``elastic-ddp``: the job pauses to reconfigure on every membership change (a learner lost or
  back) and goes on with the live learners meanwhile.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import torch

from ..chaos.trace import FailureTrace
from ..train.inner import inner_step, lr_at, make_inner_optimizer, set_lr
from ..train.tasks import Batch, Task
from .config import SimConfig
from .ledger import WorkLedger

Progress = Callable[[float, dict], None]
Observer = Callable[[str, float, dict], None]


class _Availability:
    """Per-learner outage lookup over a failure trace."""

    def __init__(self, trace: FailureTrace, num_learners: int) -> None:
        self.outages = {
            m: sorted((o.down_at, o.up_at) for o in trace.outages if o.learner == m) for m in range(num_learners)
        }

    def is_up(self, m: int, t: float) -> bool:
        return not any(down <= t < up for down, up in self.outages[m])

    def next_failure(self, m: int, after: float) -> float:
        return min((down for down, _ in self.outages[m] if down > after), default=float("inf"))

    def back_at(self, m: int, t: float) -> float:
        """When learner m is up again (t itself if it is up)."""
        for down, up in self.outages[m]:
            if down <= t < up:
                return up
        return t


def _concat(batches: list[Batch]) -> Batch:
    return Batch(
        inputs=torch.cat([b.inputs for b in batches]),
        targets=torch.cat([b.targets for b in batches]),
        tokens=sum(b.tokens for b in batches),
    )


class DataParallel:
    def __init__(
        self, config: SimConfig, task: Task, progress: Progress | None = None, observer: Observer | None = None
    ) -> None:
        self.config = config
        self.task = task
        self.progress = progress
        self.observe: Observer = observer or (lambda kind, t, details: None)
        self.generation: tuple[int, ...] | None = None  # the members of the last logged generation
        self.elastic = config.method == "elastic-ddp"
        self.model = task.build_model(config.seed)
        self.optimizer = make_inner_optimizer(self.model, config.inner)
        self.streams = [
            task.stream(m, config.learners, config.inner.batch_size, config.seed) for m in range(config.learners)
        ]
        self.samplers = [config.steps.sampler(m, config.seed) for m in range(config.learners)]
        self.avail = _Availability(config.failures, config.learners)
        self.ledger = WorkLedger(config.learners)
        numel = sum(p.numel() for p in self.model.parameters())
        # A ring all-reduce moves about twice the gradient's bytes through each link.
        self.step_bytes = 2 * numel * config.wire_bytes_per_param
        self.allreduce = config.link.transfer(self.step_bytes)

    def _generation(self, members: tuple[int, ...], t: float, reason: str) -> None:
        """Log a change of the workers that all-reduce together (as the runtime's generations)."""
        if members != self.generation:
            self.generation = members
            self.observe("generation", t, {"members": list(members), "reason": reason})

    def _outages_until(self, end: float) -> None:
        """Log the failure trace's downs and ups before the run's end: the same outages as the DiLoCo
        methods log, so every method's timeline shows them."""
        for m, spans in self.avail.outages.items():
            for down, up in spans:
                if down < end:
                    self.observe("down", down, {"learner": m})
                    if up < end:
                        self.observe("up", up, {"learner": m})

    def global_model(self) -> torch.nn.Module:
        return self.model

    def run(self) -> dict:
        wall_start = time.perf_counter()
        cfg = self.config
        t = 0.0
        tokens = 0
        steps = 0
        lost_steps = 0
        members: frozenset[int] | None = None
        longest_gap = 0.0
        last_step_end = 0.0
        everyone = range(cfg.learners)
        while tokens < cfg.tokens:
            live = frozenset(m for m in everyone if self.avail.is_up(m, t))
            if not live or (not self.elastic and len(live) < cfg.learners):
                self._generation((), t, "stalled: " + ("no worker is up" if not live else "a worker is down"))
                resume = (
                    max(self.avail.back_at(m, t) for m in everyone)
                    if not self.elastic
                    else min(self.avail.back_at(m, t) for m in everyone)
                )
                if resume == float("inf"):
                    break  # never enough learners again
                t = max(resume, t + 1e-9)
                continue
            if self.elastic and members is not None and live != members:
                t += cfg.reconfigure_seconds
                members = None  # re-check membership after the pause
                continue
            members = live
            self._generation(tuple(sorted(live)), t, "formed")
            durations = {m: self.samplers[m]() for m in sorted(live)}
            end = t + max(durations.values()) + self.allreduce
            failure = min(self.avail.next_failure(m, t) for m in live)
            if failure < end:
                lost_steps += 1
                t = failure  # the step dies with the learner; its work is lost
                continue
            batches = [self.streams[m].next() for m in sorted(live)]
            batch = _concat(batches)
            set_lr(self.optimizer, lr_at(cfg.inner, steps, tokens / cfg.tokens))
            loss = inner_step(self.model, self.optimizer, self.task.loss(self.model, batch), cfg.inner.grad_clip)
            for m, b in zip(sorted(live), batches, strict=True):
                self.ledger.step(m, 0, t, t + durations[m], b.tokens, share=1.0)
            longest_gap = max(longest_gap, end - last_step_end)
            last_step_end = end
            tokens += batch.tokens
            steps += 1
            t = end
            if self.progress is not None:
                self.progress(min(1.0, tokens / cfg.tokens), {"loss": loss, "time": t, "tokens": tokens})
        self._outages_until(t)
        summary = self.ledger.summary(t)
        return {
            **summary,
            "sim_seconds": t,
            "wall_seconds": time.perf_counter() - wall_start,
            "outer_steps": 0,
            "contributions": 0,
            "rejected_contributions": 0,
            "inner_steps": steps,
            "lost_steps": lost_steps,
            "longest_gap_seconds": longest_gap,
            "peak_step_bytes": self.step_bytes,
        }
