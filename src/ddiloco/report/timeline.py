"""Who was up when, and when which fragment merged, from a run's events (simulator or runtime)."""

from __future__ import annotations

from dataclasses import dataclass

from ..records.rundir import RunRecord


@dataclass(frozen=True)
class Generation:
    """From `t` on, `size` workers all-reduced together (0: the job stalled)."""

    t: float
    size: int


@dataclass(frozen=True)
class MergePoint:
    t: float
    fragment: int
    admitted: int


def run_end(record: RunRecord) -> float:
    """The run's length in seconds since its start: the simulated time for `ddiloco sim`, else the
    wall time, and never before its last event or metric."""
    key = "sim_seconds" if record.config.get("command") == "sim" else "wall_seconds"
    reported = record.summary.get(key)
    times = [record.event_time(e) for e in record.events] + [m["t"] for m in record.metrics]
    if isinstance(reported, (int, float)):
        times.append(float(reported))
    return max(times, default=0.0)


def learner_intervals(record: RunRecord) -> dict[int, list[tuple[float, float]]]:
    """Per learner, the [start, end) intervals during which it was up.

    The simulator logs `down` and `up` (every learner starts up at 0); the launcher logs
    `learner_started` and `learner_exited` for each process it runs.
    """
    learners = int(record.config.get("settings", {}).get("learners", 0) or 0)
    simulated = record.config.get("command") == "sim"
    up_since: dict[int, float | None] = {m: 0.0 if simulated else None for m in range(learners)}
    intervals: dict[int, list[tuple[float, float]]] = {m: [] for m in range(learners)}
    for e in record.events:
        kind, m = e.get("kind"), e.get("learner")
        if not isinstance(m, int):
            continue
        t = record.event_time(e)
        if kind in ("up", "learner_started"):
            if up_since.get(m) is None:
                up_since[m] = t
        elif kind in ("down", "learner_exited", "learner_terminated"):
            start = up_since.get(m)
            if start is not None:
                intervals.setdefault(m, []).append((start, t))
            up_since[m] = None
    end = run_end(record)
    for m, start in up_since.items():
        if start is not None and end > start:
            intervals.setdefault(m, []).append((start, end))
    return intervals


def merges(record: RunRecord) -> list[MergePoint]:
    out = []
    for e in record.events:
        if e.get("kind") == "merge" and isinstance(e.get("fragment"), int):
            admitted = e.get("learners")
            if not isinstance(admitted, list):
                admitted = e.get("admitted") or []
            out.append(MergePoint(record.event_time(e), e["fragment"], len(admitted)))
    return out


def generations(record: RunRecord) -> list[Generation]:
    """A data-parallel run's generations: how many workers all-reduced together from when on."""
    return [
        Generation(record.event_time(e), len(e["members"]))
        for e in record.events
        if e.get("kind") == "generation" and isinstance(e.get("members"), list)
    ]
