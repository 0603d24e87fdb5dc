"""The live state of a run, defined once for the terminal view and the web dashboard.

Goodput "so far" is the synchronizers' merged compute seconds over the learners' allocated time
since the first one joined, and the longest stall counts from that join too: the same definitions
and window as the final summary (`summary`).
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # handed in; nothing of the supervisor is imported at run time
    from .supervisor import Supervisor


def goodput_so_far(statuses: list[dict], learners: int, now: float) -> float:
    """Merged compute seconds over the learners' time since the first join, across shards, until now
    or the stop (the summary's window ends where the stop was decided: the last frame agrees)."""
    joined = [float(s["first_join_wall"]) for s in statuses if s.get("first_join_wall")]
    stops = [float(s["stop_wall"]) for s in statuses if s.get("stop_wall")]
    window = min([now, *stops]) - min(joined) if joined else 0.0
    useful = sum(float(s.get("useful_seconds", 0.0)) for s in statuses)
    return useful / (learners * window) if window > 0 else 0.0


def snapshot(sup: Supervisor, eval_loss: float | None) -> dict:
    statuses = [s.status for s in sup.shards if s.status]
    return {
        "method": sup.config.method,
        "elapsed": sup.elapsed(),
        "duration": sup.config.duration,
        "tokens": max((int(s.get("tokens_reported", 0)) for s in statuses), default=0),
        "token_budget": sup.config.tokens,
        "version": sum(int(s.get("version_sum", 0)) for s in statuses),
        "merges": sum(int(s.get("merges", 0)) for s in statuses),
        "goodput": goodput_so_far(statuses, sup.config.learners, time.time()),
        "stall_seconds_max": max((float(s.get("stall_seconds_max", 0.0)) for s in statuses), default=0.0),
        "eval_loss": eval_loss,
        "learner_restarts": sup.learner_restarts,
        "stopping": sup.stopping,
        "learners": sup.learner_rows(),
        "shards": [
            {"index": s.index, "state": s.state, "pid": s.child.pid if s.child else None, "restarts": s.restarts}
            for s in sup.shards
        ],
    }
