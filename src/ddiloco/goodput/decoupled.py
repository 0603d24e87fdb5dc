"""Decoupled DiLoCo: M elastic learners that never wait for each other.

Each learner is an elastic data-parallel job over its N/M chips (see elastic.py). Its work counts
whenever it runs, except for:
- the step in flight at a failure (as for elastic data-parallel);
- a rejoin after each failure pause (`rejoin_s`): before computing again the learner re-registers
  with the synchronizer over the cross-datacenter network and receives the fragments merged while
  it was away;
- the quorum: the synchronizer merges a fragment only once K learners have made progress. While
  fewer than K learners run, the running ones may still go tau steps ahead (the overlap the
  schedule allows for a sync), then they wait for the quorum. With K = 1 nobody ever waits.
The grace window spends only the slack left inside those tau steps, so it changes who gets into a
merge, never how much anyone computes: it has no goodput effect and no parameter here.

The global model advances while at least K learners run: that is the uptime.
"""

from __future__ import annotations

import numpy as np

from .config import GoodputConfig
from .elastic import elastic_segments
from .failures import SliceOutages
from .partition import learner_of_slice
from .progress import Cumulative
from .result import MethodResult
from .timeline import Segments, count_running, low_windows


def quorum_blocked_work(seg: Segments, quorum: int, slack_s: float) -> float:
    """Useful chip-seconds lost because fewer than `quorum` learners ran for longer than the slack."""
    if quorum <= 1:
        return 0.0
    t, count = count_running(seg)
    lo, hi = low_windows(t, count, quorum)
    lo = lo + slack_s
    keep = hi > lo
    lo, hi = lo[keep], hi[keep]
    if lo.size == 0:
        return 0.0
    cum = Cumulative(seg)
    groups = np.repeat(np.arange(seg.num_groups), lo.size)
    a = np.tile(lo, seg.num_groups)
    b = np.tile(hi, seg.num_groups)
    return float((cum.useful_at(groups, b) - cum.useful_at(groups, a)).sum())


def quorum_uptime(seg: Segments, quorum: int) -> float:
    """Share of time at least `quorum` learners run."""
    t, count = count_running(seg)
    return float(np.diff(t)[count >= quorum].sum() / seg.horizon)


def simulate_decoupled(outages: SliceOutages, learners: int, config: GoodputConfig, seed: int = 0) -> MethodResult:
    if config.quorum > learners:
        raise ValueError(f"quorum K={config.quorum} cannot exceed the number of learners M={learners}")
    groups = learner_of_slice(outages.num_slices, learners)
    seg = elastic_segments(outages, groups, config, extra_failure_pause=config.rejoin_s)
    useful = seg.useful_chip_seconds().sum() - quorum_blocked_work(seg, config.quorum, config.slack_s)
    return MethodResult(
        method="decoupled",
        learners=learners,
        chips=outages.chips,
        seed=seed,
        goodput=float(useful / (outages.chips * outages.horizon)),
        uptime=quorum_uptime(seg, config.quorum),
    )
