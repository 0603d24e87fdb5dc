"""What a learner tells about itself: the progress its heartbeats carry, its journal on disk, its
counters, and the progress line it logs."""

from __future__ import annotations

import logging
import time
from typing import Any

LearnerClient = Any  # a `client.LearnerClient`; not imported here, which imports this module

log = logging.getLogger("ddiloco.learner.client")


def progress(c: LearnerClient) -> dict:
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


def write_journal(c: LearnerClient) -> None:
    c.journal.write(
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
            "waits": c.waits,  # step boundaries held back for a merged fragment (blocking, streaming)
            "wait_seconds": round(c.wait_seconds, 3),
            "grant_waits": c.grant_waits,  # step boundaries held at the token grant (the budget's end)
            "grant_wait_seconds": round(c.grant_wait_seconds, 3),
        }
    )


def stats(c: LearnerClient) -> dict:
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
        "counted_position": c.counted_position,
        "versions": list(c.core.versions) if c.core else [],
        **totals,
        "rejections": list(c.rejected[-5:]),
        "recovered": c.recovered,
        "donations": len(c.donations),
        "overlap": c.overlap.summary() if c.overlap is not None else None,
        **(c.ending.as_dict() if c.ending is not None else {"ended": None, "exit_code": 0}),
        "waits": c.waits,
        "wait_seconds": c.wait_seconds,
        "grant_waits": c.grant_waits,
        "grant_wait_seconds": c.grant_wait_seconds,
    }


def log_line(c: LearnerClient) -> None:
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
