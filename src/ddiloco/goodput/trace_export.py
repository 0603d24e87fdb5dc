"""Write the M-learner failure trace that the virtual-clock driver and the real launcher replay.

A learner is down while it does not train: from a failure until it has detected it, reconfigured
and rejoined, and during the pause that takes a repaired slice back. Those are exactly the gaps
between its running intervals, so the trace is the complement of the learner's `Segments`. One
chaos schedule thus drives the chip-scale simulation, `ddiloco sim` and `ddiloco run
--chaos-trace`, with times divided by `scale` (simulated seconds per trace second).
"""

from __future__ import annotations

import numpy as np

from ddiloco.chaos.trace import FailureTrace, Outage

from .config import GoodputConfig
from .elastic import elastic_segments
from .failures import SliceOutages
from .partition import learner_of_slice
from .timeline import Segments


def pauses(seg: Segments) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(group, down_at, up_at) of every gap between a group's running intervals in [0, horizon)."""
    g, s, e, h = seg.group, seg.start, seg.end, seg.horizon
    first = np.r_[True, g[1:] != g[:-1]] if g.size else np.zeros(0, bool)
    last = np.r_[g[1:] != g[:-1], True] if g.size else np.zeros(0, bool)
    prev_end = np.where(first, 0.0, np.r_[0.0, e[:-1]])
    gap_g = [g, g[last]]
    gap_s = [prev_end, e[last]]
    gap_e = [s, np.full(int(last.sum()), h)]
    never = np.setdiff1d(np.arange(seg.num_groups), g)  # groups that never run
    gap_g.append(never)
    gap_s.append(np.zeros(never.size))
    gap_e.append(np.full(never.size, h))
    gg, ss, ee = (np.concatenate(x) for x in (gap_g, gap_s, gap_e))
    keep = ee > ss
    return gg[keep], ss[keep], ee[keep]


def learner_trace(outages: SliceOutages, learners: int, config: GoodputConfig, scale: float = 1.0) -> FailureTrace:
    """Down/up times of M Decoupled DiLoCo learners, in trace seconds (simulated seconds / scale)."""
    if not scale > 0:
        raise ValueError(f"trace scale must be > 0, got {scale}")
    seg = elastic_segments(
        outages, learner_of_slice(outages.num_slices, learners), config, extra_failure_pause=config.rejoin_s
    )
    g, s, e = pauses(seg)
    return FailureTrace.of(Outage(float(a) / scale, int(m), float(b) / scale) for m, a, b in zip(g, s, e, strict=True))
