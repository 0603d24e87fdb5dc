"""An overlap that fits the link (`--overlap auto`): tau chosen from what the learner measures.

The paper's Eq. 3 leaves the grace window gamma * (tau * xi_step - xi_quorum - xi_sync): the tau
steps a learner trains while its fragment travels to the synchronizer, is merged and comes back.
Behind a long link that trip alone can take longer than tau steps, and the slack is negative before
a byte is sent: the round merges at its quorum and everyone else's work is late. So each learner
measures its link (heartbeat round trips and whole pushes, `LinkTime`) and widens its tau by the
steps the trip takes:

    tau = tau_0 + ceil(link_seconds / step_seconds),   at most H - 1 (never below tau_0)

tau_0 (`--overlap`'s base, 2) is the paper's overlap, kept for the grace window itself. The learner
sends its tau and link time with each contribution; the synchronizer's window spends
tau * xi_step - link - xi_quorum - xi_sync (`core.timing`), so it is as long behind a long link as
on loopback. Blocking syncs (tau_0 = 0, synchronous DiLoCo) wait instead and are left alone.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from dataclasses import dataclass, field

from ..core.timing import Ema

log = logging.getLogger(__name__)
MAX_CHANGES_KEPT = 32


class LinkTime:
    """One link's measured times: heartbeat round trips and whole pushes (smoothed)."""

    def __init__(self, alpha: float = 0.2) -> None:
        self._lock = threading.Lock()
        self.round_trip = Ema(alpha)
        self.push = Ema(alpha)

    def observe_round_trip(self, seconds: float) -> None:
        with self._lock:
            self.round_trip.update(max(0.0, seconds))

    def observe_push(self, seconds: float) -> None:
        with self._lock:
            self.push.update(max(0.0, seconds))

    def seconds(self) -> float:
        """From a snapshot to its merged update back, less the synchronizer's own time. A push takes
        (a connection's round trip,) the way there, its bytes and the reply's way back, which stands
        for the update's way down; the update's bytes are taken as the push's, what the push took
        beyond two round trips (a connection and the call itself)."""
        with self._lock:
            push, rtt = self.push.get(), self.round_trip.get()
        if push <= 0:
            return rtt  # nothing pushed yet: the round trip is all that is known
        return push + max(0.0, push - 2 * rtt)


def choose_overlap(base: int, sync_every: int, step_seconds: float, link_seconds: float) -> int:
    """tau_0 + ceil(link / step), at most H - 1 (the schedule's bound) and at least tau_0; tau_0 = 0
    (blocking) stays 0."""
    if base <= 0 or step_seconds <= 0 or not math.isfinite(link_seconds):
        return base
    extra = math.ceil(max(0.0, link_seconds) / step_seconds - 1e-9)
    return max(base, min(base + extra, sync_every - 1))


@dataclass
class OverlapChooser:
    """A learner's tau over a run: the current choice, why, and its changes (for the log and summary)."""

    base: int
    sync_every: int
    auto: bool
    tau: int = field(init=False)
    link_seconds: float = 0.0
    step_seconds: float = 0.0
    changes: list[dict] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.tau = self.base

    def update(self, step_seconds: float, link_seconds: float) -> int:
        """The tau to use from now on, from the smoothed step time and the slowest link's time."""
        self.step_seconds, self.link_seconds = step_seconds, link_seconds
        if not self.auto:
            return self.tau
        tau = choose_overlap(self.base, self.sync_every, step_seconds, link_seconds)
        if tau != self.tau:
            why = self.reason(tau)
            log.info("overlap tau %d -> %d: %s", self.tau, tau, why)
            self.changes.append({"wall": time.time(), "from": self.tau, "tau": tau, "why": why})
            del self.changes[:-MAX_CHANGES_KEPT]
            self.tau = tau
        return self.tau

    def reason(self, tau: int | None = None) -> str:
        tau = self.tau if tau is None else tau
        if not self.auto:
            return f"fixed by --overlap {self.base}"
        if self.base == 0:
            return "blocking syncs (synchronous DiLoCo) wait for the update instead"
        cap = " (capped at H - 1)" if tau == self.sync_every - 1 and tau > self.base else ""
        return (
            f"tau_0 {self.base} + ceil(link {self.link_seconds:.3f} s / step {self.step_seconds:.3f} s){cap}"
            if self.step_seconds > 0
            else f"tau_0 {self.base}: no step time measured yet"
        )

    def summary(self) -> dict:
        return {
            "tau": self.tau,
            "auto": self.auto,
            "base": self.base,
            "link_seconds": round(self.link_seconds, 4),
            "step_seconds": round(self.step_seconds, 4),
            "why": self.reason(),
            "changes": list(self.changes),
        }
