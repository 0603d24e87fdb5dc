"""The pure parts of benchmarks/time_to_loss.py: eval-loss curves from a run directory, the seconds a
curve takes to reach a loss, a curve's loss at a given second (tests/benchmarks/test_time_to_loss.py)."""

from __future__ import annotations

import json
import math
from pathlib import Path

from runs import ddiloco_run

Curve = list[tuple[float, float]]


def window(run_dir: Path, summary: dict) -> tuple[float, float]:
    """(start, stop) of the run's training window in seconds from its launch: from the first learner
    joined (data-parallel: the first generation formed) to the budget reached (or the cap). Process
    start-up before it is left out, as a fixed cost that does not grow with a run (seconds here,
    nothing next to hours); the final evaluation and the shutdown after it are no training."""
    config = json.loads((run_dir / "config.json").read_text())
    start = float(summary["window_start"]) - float(config.get("clock_origin", 0.0))
    return start, start + float(summary["run_seconds"])


def read_curve(run_dir: Path, span: tuple[float, float] | None = None) -> Curve:
    """(seconds, eval loss) of every evaluation in metrics.jsonl, in time order. With `span` (the
    window): seconds from its start; the evaluations outside it are dropped, except the final one (the
    final model's, on more batches), put at the window's end: from then on the model does not change."""
    lines = (run_dir / "metrics.jsonl").read_text().splitlines()
    points = [
        (float(e["t"]), float(e["eval_loss"]))
        for e in map(json.loads, lines)
        if e.get("kind") == "eval" and isinstance(e.get("eval_loss"), (int, float)) and math.isfinite(e["eval_loss"])
    ]
    if span is None or not points:
        return sorted(points)
    start, stop = span
    final = points[-1]
    during = sorted((t - start, loss) for t, loss in points[:-1] if start <= t < stop)
    return [*during, (max(stop - start, during[-1][0] if during else 0.0), final[1])]


def eval_batches(run_dir: Path) -> int | None:
    """The validation batches every evaluation of the run used (its curve's and its final one): one
    count, or ValueError when they differ (a curve and a target on different sets are no comparison);
    None for a run that recorded none."""
    lines = (run_dir / "metrics.jsonl").read_text().splitlines()
    counts = {e.get("eval_batches") for e in map(json.loads, lines) if e.get("kind") == "eval"}
    if len(counts) > 1 or None in counts and counts != {None}:
        raise ValueError(f"{run_dir}: its evaluations used different validation batches: {counts}")
    return counts.pop() if counts else None


def seconds_to_target(curve: Curve, target: float) -> float | None:
    """The first second the curve is at or below `target`, linear between two evaluations; None if never."""
    previous = None
    for t, loss in curve:
        if loss <= target:
            if previous is None or previous[1] <= target:
                return t
            t0, l0 = previous
            return t0 + (l0 - target) / (l0 - loss) * (t - t0)
        previous = (t, loss)
    return None


def loss_at(curve: Curve, when: float) -> float | None:
    """The curve's loss at second `when`, linear between evaluations; the last one's after it (the run
    was over, its model final); None before the first evaluation."""
    if not curve or when < curve[0][0]:
        return None
    for (t0, l0), (t1, l1) in zip(curve, curve[1:], strict=False):
        if t0 <= when <= t1:
            return l0 if t1 == t0 else l0 + (l1 - l0) * (when - t0) / (t1 - t0)
    return curve[-1][1]


def sim_run(flags: list[str], run_dir: Path) -> dict:
    """`ddiloco sim FLAGS`: its summary and its eval-loss curve on the virtual clock."""
    summary = ddiloco_run(flags, run_dir, "virtual clock", command="sim")
    curve = read_curve(run_dir)
    return {"summary": summary, "curve": curve, "finish": curve[-1][0] if curve else math.nan}
