"""Data-parallel without elasticity: any failure stops the whole job.

The job needs all its slices, so after a failure it restarts on a hot spare slice (the repaired one
becomes a spare later): it is down for detection + restart, and it loses the work done since its
last checkpoint. Because failed slices are swapped out, the job always runs on N healthy chips and
its failures are a Poisson process of rate N/MTBI in running time, independent of repair times (see
`sample_job_failures` and `timeline.on_running_clock`): a paused job is not interrupted, so a
failure costs one restart, never a restart started over. Checkpoints are taken every
`checkpoint_s` of running time, counted from the end of each restart; the work of an interval cut
by the horizon counts in full.

The spares are allocated chips too: the job holds N plus a pool the size of the slices under repair
(`spare_pool`), idle while the job runs, and goodput divides by all of them.
"""

from __future__ import annotations

import numpy as np

from .config import GoodputConfig
from .result import MethodResult
from .timeline import Events, failure_clock_shift, running_segments


def spare_pool(chips: int, config: GoodputConfig) -> float:
    """Chips the job holds: its N, plus hot spares for the slices under repair (allocated, idle)."""
    return chips / (1.0 - config.repair_share)


def simulate_ddp(
    failure_times: np.ndarray, chips: int, horizon: float, config: GoodputConfig, seed: int = 0
) -> MethodResult:
    """Goodput and uptime of one non-elastic job given the times at which it fails."""
    t = np.sort(np.asarray(failure_times, dtype=np.float64))
    t = t[(t >= 0) & (t < horizon)]
    window = config.detect_s + config.restart_s
    t = t + failure_clock_shift(t, np.zeros(t.size, np.int64), np.full(t.size, window))
    t = t[t < horizon]
    n = t.size
    events = Events(t, np.zeros(n, np.int64), np.full(n, window), np.ones(n, bool), np.zeros(n, np.int64))
    seg = running_segments(events, np.array([chips]), np.zeros(1), horizon, config.checkpoint_s)
    return MethodResult(
        method="ddp",
        learners=1,
        chips=chips,
        seed=seed,
        goodput=float(seg.useful_chip_seconds().sum() / (spare_pool(chips, config) * horizon)),
        uptime=float(seg.running_seconds().sum() / horizon),
    )
