"""Data-parallel without elasticity: any failure stops the whole job.

The job needs all its slices, so after a failure it restarts on a hot spare slice (the repaired one
becomes a spare later): it is down for detection + restart, and it loses the work done since its
last checkpoint. A failure while the job is down or restarting starts the restart over (the new
allocation lost a slice too). Checkpoints are taken every `checkpoint_s` of running time, counted
from the end of each restart; the work of an interval cut by the horizon counts in full.

The spare slices are not counted as allocated chips, which flatters this method by at most the
share of slices under repair (about 3 % with the defaults); see docs/goodput.md.
"""

from __future__ import annotations

import numpy as np

from .config import GoodputConfig
from .failures import SliceOutages
from .result import MethodResult
from .timeline import Events, running_segments


def simulate_ddp(outages: SliceOutages, config: GoodputConfig, seed: int = 0) -> MethodResult:
    h = outages.horizon
    t = outages.down_at[(outages.down_at >= 0) & (outages.down_at < h)]
    n = t.size
    events = Events(t, np.zeros(n, np.int64), np.full(n, config.detect_s + config.restart_s),
                    np.ones(n, bool), np.zeros(n, np.int64))
    seg = running_segments(events, np.array([outages.chips]), np.zeros(1), h, config.checkpoint_s)
    return MethodResult(
        method="ddp", learners=1, chips=outages.chips, seed=seed,
        goodput=float(seg.useful_chip_seconds().sum() / (outages.chips * h)),
        uptime=float(seg.running_seconds().sum() / h),
    )
