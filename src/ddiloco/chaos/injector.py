"""Faults for real processes: kill -9 learners on a schedule, SIGSTOP stragglers, kill the synchronizer.

Learner outages are a `FailureTrace` (learner, down_at, up_at), the same format the simulators replay:
either given with --chaos-trace, or drawn from --learner-mtbf (exponential times between failures,
each followed by --learner-down seconds down). The whole schedule is drawn up front from the seed,
so two runs with the same seed and flags (say, Decoupled DiLoCo and the synchronous baseline) get
exactly the same faults at the same wall-clock offsets; the launcher saves it as chaos-trace.csv.
"""

from __future__ import annotations

import heapq
import math
from dataclasses import dataclass

import numpy as np

from .trace import FailureTrace, Outage


@dataclass(frozen=True)
class ChaosSettings:
    learner_mtbf: float | None = None  # mean seconds between kill -9 of each learner
    learner_down: float = 15.0  # seconds a killed learner stays down before it is restarted
    straggle: float | None = None  # SIGSTOP a random learner for this many seconds ...
    straggle_every: float = 30.0  # ... at exponential intervals of this mean
    kill_synchronizer_at: float | None = None  # kill -9 a synchronizer shard this many seconds in
    synchronizer_down: float = 1.0  # and restart it after this many seconds
    kill_shards: tuple[int, ...] = (0,)  # the shards killed, one after the other ...
    kill_every: float = 5.0  # ... this many seconds apart
    net_delay_ms: float = 0.0  # added latency per message, in the learners' communication threads
    trace: FailureTrace | None = None
    seed: int = 0

    def __post_init__(self) -> None:
        if self.learner_mtbf is not None and self.trace is not None:
            raise ValueError("give either --learner-mtbf or --chaos-trace, not both")
        for name in ("learner_mtbf", "straggle", "kill_synchronizer_at"):
            value = getattr(self, name)
            if value is not None and not (math.isfinite(value) and value > 0):
                raise ValueError(f"--{name.replace('_', '-')} must be > 0, got {value}")
        if self.learner_down < 0 or self.synchronizer_down < 0 or self.net_delay_ms < 0 or self.straggle_every <= 0:
            raise ValueError("down times and --net-delay must be >= 0, --straggle-every > 0")
        if not self.kill_shards or any(s < 0 for s in self.kill_shards) or not self.kill_every > 0:
            raise ValueError("--kill-shards needs shard numbers >= 0 and --kill-every > 0")

    @property
    def active(self) -> bool:
        return any(v is not None for v in (self.learner_mtbf, self.straggle, self.kill_synchronizer_at, self.trace))


def learner_trace(settings: ChaosSettings, learners: int, horizon: float) -> FailureTrace:
    """The learner outages of this run (empty without --learner-mtbf or --chaos-trace)."""
    if settings.trace is not None:
        return settings.trace.for_learners(learners)
    if settings.learner_mtbf is None:
        return FailureTrace()
    rng = np.random.default_rng([settings.seed, 104729])
    outages = []
    for m in range(learners):
        t = float(rng.exponential(settings.learner_mtbf))
        while t < horizon:
            outages.append(Outage(t, m, t + max(settings.learner_down, 1e-3)))
            t += settings.learner_down + float(rng.exponential(settings.learner_mtbf))
    return FailureTrace.of(outages)


@dataclass(frozen=True, order=True)
class ChaosEvent:
    time: float
    kind: str  # kill_learner | restart_learner | sigstop | sigcont | kill_sync | restart_sync
    target: int  # learner id or shard; -1: a random running learner (stragglers)


class ChaosInjector:
    """Hands out the events that are due; the supervisor carries them out."""

    def __init__(self, settings: ChaosSettings, learners: int, horizon: float) -> None:
        self.settings = settings
        self.trace = learner_trace(settings, learners, horizon)
        self.rng = np.random.default_rng([settings.seed, 15485863])
        events: list[ChaosEvent] = []
        for o in self.trace.outages:
            events.append(ChaosEvent(o.down_at, "kill_learner", o.learner))
            if math.isfinite(o.up_at):
                events.append(ChaosEvent(o.up_at, "restart_learner", o.learner))
        if settings.straggle is not None:
            t = float(self.rng.exponential(settings.straggle_every))
            while t < horizon:
                events.append(ChaosEvent(t, "sigstop", -1))
                t += settings.straggle + float(self.rng.exponential(settings.straggle_every))
        if settings.kill_synchronizer_at is not None:
            for i, shard in enumerate(settings.kill_shards):
                at = settings.kill_synchronizer_at + i * settings.kill_every
                events.append(ChaosEvent(at, "kill_sync", shard))
                events.append(ChaosEvent(at + settings.synchronizer_down, "restart_sync", shard))
        heapq.heapify(events)
        self._events = events

    def due(self, now: float) -> list[ChaosEvent]:
        out = []
        while self._events and self._events[0].time <= now:
            out.append(heapq.heappop(self._events))
        return out

    def schedule(self, event: ChaosEvent) -> None:
        heapq.heappush(self._events, event)

    def pick(self, candidates: list[int]) -> int | None:
        return int(self.rng.choice(candidates)) if candidates else None

    def downtime(self, learner: int, horizon: float) -> float:
        return self.trace.downtime(learner, horizon)
