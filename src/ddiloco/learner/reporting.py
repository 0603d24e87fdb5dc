"""What a learner tells about itself: the progress its heartbeats carry, its journal on disk, its
counters, and the progress line it logs."""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING, Protocol

from .leader import Leader, Tally

if TYPE_CHECKING:
    from ..core import LearnerCore
    from .ending import Ending
    from .journal import Journal
    from .link import ShardLink
    from .overlap import OverlapChooser

log = logging.getLogger("ddiloco.learner.client")


class Reported(Protocol):
    """What these functions read of a `client.LearnerClient` (which imports this module: no import back)."""

    learner: int
    incarnation: str
    state: str
    steps: int
    tokens: int
    compute_seconds: float
    loss: float | None
    position: int
    start_position: int
    started_wall: float
    recovered: dict | None
    core: LearnerCore | None
    links: list[ShardLink]
    overlap: OverlapChooser | None
    leader: Leader | None

    @property
    def progress(self) -> float: ...
    @property
    def ending(self) -> Ending | None: ...


def tally(c: Reported) -> Tally:
    """What rank 0's leader counted at the step boundaries; nothing on the other ranks, or before `start`."""
    return c.leader.tally if c.leader is not None else Tally()


def progress(c: Reported) -> dict:
    """Sent with every heartbeat (the synchronizer's status and dashboard show it)."""
    return {
        "step": c.steps,
        "tokens": c.tokens,
        "position": c.position,
        "state": c.state,
        "step_time": c.core.step_time.get() if c.core else 0.0,
        "loss": c.loss,
        "overlap": c.core.overlap if c.core else None,
        "link_seconds": round(c.core.link_seconds, 4) if c.core else 0.0,
    }


def write_journal(c: Reported, journal: Journal) -> None:
    t = tally(c)
    journal.write(
        {
            "learner": c.learner,
            "incarnation": c.incarnation,
            "steps": c.steps,
            "tokens": c.tokens,
            "seconds": c.compute_seconds,
            "start_position": c.start_position,
            "position": c.position,
            "started": c.started_wall,
            "updated": time.time(),
            "state": c.state,
            "versions": list(c.core.versions) if c.core is not None else [],
            "bytes_pushed": sum(link.stats.bytes_pushed for link in c.links),
            "bytes_received": sum(link.stats.bytes_received for link in c.links),
            # share-weighted tokens (as merged tokens are): sent in contributions, overwritten unsent
            "tokens_sent": round(c.core.tokens_sent, 1) if c.core is not None else 0.0,
            "tokens_overwritten": round(c.core.tokens_overwritten, 1) if c.core is not None else 0.0,
            "overlap": c.overlap.tau if c.overlap is not None else None,
            "overlap_why": c.overlap.reason()[:120] if c.overlap is not None else None,
            "waits": t.waits,  # step boundaries held back for a merged fragment (blocking, streaming)
            "wait_seconds": round(t.wait_seconds, 3),
            "grant_waits": t.grant_waits,  # step boundaries held at the token grant (the budget's end)
            "grant_wait_seconds": round(t.grant_wait_seconds, 3),
            "grants_outwaited": t.grants_outwaited,
        }
    )


def stats(c: Reported) -> dict:
    t = tally(c)
    links = [link.stats for link in c.links]
    totals = {
        k: sum(getattr(s, k) for s in links)
        for k in (
            "pushed",
            "accepted",
            "rejected",
            "lost_in_transit",
            "registrations",
            "bytes_pushed",
            "bytes_received",
        )
    }
    return {
        "learner": c.learner,
        "incarnation": c.incarnation,
        "steps": c.steps,
        "tokens": c.tokens,
        "compute_seconds": c.compute_seconds,
        "start_position": c.start_position,
        "position": c.position,
        "counted_position": max(c.start_position, t.counted_position),  # or further, where a synchronizer says so
        "versions": list(c.core.versions) if c.core else [],
        **totals,
        "rejections": list(t.rejected[-5:]),
        "recovered": c.recovered,
        "donations": len(t.donations),
        "overlap": c.overlap.summary() if c.overlap is not None else None,
        **(c.ending.as_dict() if c.ending is not None else {"ended": None, "exit_code": 0}),
        "waits": t.waits,
        "wait_seconds": t.wait_seconds,
        "grant_waits": t.grant_waits,
        "grant_wait_seconds": t.grant_wait_seconds,
        "grants_outwaited": t.grants_outwaited,
    }


def log_line(c: Reported) -> None:
    s = stats(c)
    loss = f"loss {c.loss:.4f}, " if c.loss is not None else ""
    log.info(
        "learner %d: step %d, %d tokens, %sfragment versions %s, %d contributions accepted, %d rejected, "
        "run %.0f%% done",
        c.learner,
        s["steps"],
        s["tokens"],
        loss,
        s["versions"],
        s["accepted"],
        s["rejected"],
        100 * c.progress,
    )
