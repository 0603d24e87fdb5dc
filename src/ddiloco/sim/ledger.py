"""Who computed what, when, and which of it reached the global model.

    goodput     = chip-seconds of steps whose work reached the global model / chip-seconds allocated
    utilization = chip-seconds spent computing steps (merged or not) / chip-seconds allocated
    uptime      = share of the run during which some step that reached the global model was computing

A step's work "reaches the global model" fragment by fragment: when a merge admits a learner's
snapshot of fragment p, the steps since that learner last received p count for p's share of the
parameters. Every learner is allocated for the whole run, down or not.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field

from ..records.intervals import union_length


@dataclass
class _Steps:
    starts: list[float] = field(default_factory=list)
    ends: list[float] = field(default_factory=list)
    tokens: list[int] = field(default_factory=list)
    share: list[float] = field(default_factory=list)


class WorkLedger:
    def __init__(self, num_learners: int) -> None:
        if num_learners < 1:
            raise ValueError("need at least one learner")
        self.num_learners = num_learners
        self._runs: dict[tuple[int, int], _Steps] = defaultdict(_Steps)

    def step(self, learner: int, incarnation: int, start: float, end: float, tokens: int, share: float = 0.0) -> int:
        """Record a completed step; returns its 1-based index within this incarnation."""
        if end < start:
            raise ValueError("a step cannot end before it starts")
        run = self._runs[(learner, incarnation)]
        run.starts.append(start)
        run.ends.append(end)
        run.tokens.append(tokens)
        run.share.append(share)
        return len(run.starts)

    def reached_model(self, learner: int, incarnation: int, last_step: int, steps: int, share: float) -> None:
        """Steps last_step-steps+1 .. last_step of this incarnation reached the model for `share`."""
        run = self._runs.get((learner, incarnation))
        if run is None or not 1 <= last_step <= len(run.starts) or steps > last_step:
            raise ValueError(f"learner {learner}/{incarnation} has no steps {last_step - steps + 1}..{last_step}")
        span = range(last_step - steps, last_step)
        over = [i + 1 for i in span if run.share[i] + share > 1.0 + 1e-9]
        if over:  # the same work merged twice: a driver defect that a silent cap would hide
            raise ValueError(
                f"learner {learner}/{incarnation}: steps {over[:5]} would reach the model for more "
                f"than all of it (double-merged work)"
            )
        for i in span:
            total = run.share[i] + share
            run.share[i] = 1.0 if total > 1.0 - 1e-9 else total  # only float rounding is cut

    def summary(self, end_time: float) -> dict[str, float]:
        allocated = self.num_learners * end_time
        busy = useful = tokens_trained = tokens_merged = 0.0
        intervals = []
        for run in self._runs.values():
            for start, end, tokens, share in zip(run.starts, run.ends, run.tokens, run.share, strict=True):
                busy += end - start
                useful += (end - start) * share
                tokens_trained += tokens
                tokens_merged += tokens * share
                if share > 0:
                    intervals.append((start, end))
        return {
            "goodput": useful / allocated if allocated > 0 else 0.0,
            "utilization": busy / allocated if allocated > 0 else 0.0,
            "uptime": union_length(intervals) / end_time if end_time > 0 else 0.0,
            "tokens_trained": int(tokens_trained),
            # fractional shares (a fragment's part of a step) add up with float rounding; it is cut so
            # that merged never reads above trained
            "tokens_merged": min(float(int(tokens_trained)), round(tokens_merged, 6)),
        }
