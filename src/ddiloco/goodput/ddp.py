"""Data-parallel without elasticity: any failure stops the whole job.

The job needs all its slices, so after a failure it restarts on a hot spare slice (the repaired one
becomes a spare later): it is down for detection + restart, and it loses the work done since its
last checkpoint. Because failed slices are swapped out, the job always runs on N healthy chips and
its failures are a Poisson process of rate N/MTBI, independent of repair times (see
`sample_job_failures`). A failure while the job is down or restarting starts the restart over (the
new allocation lost a slice too). Checkpoints are taken every `checkpoint_s` of running time,
counted from the end of each restart; the work of an interval cut by the horizon counts in full.

The spare slices are not counted as allocated chips, which flatters this method by at most the
share of slices under repair (about 3 % with the defaults); see docs/goodput.md.
"""

from __future__ import annotations

import numpy as np

from .config import GoodputConfig
from .result import MethodResult
from .timeline import Events, running_segments


def simulate_ddp(
    failure_times: np.ndarray, chips: int, horizon: float, config: GoodputConfig, seed: int = 0
) -> MethodResult:
    """Goodput and uptime of one non-elastic job given the times at which it fails."""
    t = np.sort(np.asarray(failure_times, dtype=np.float64))
    t = t[(t >= 0) & (t < horizon)]
    n = t.size
    events = Events(t, np.zeros(n, np.int64), np.full(n, config.detect_s + config.restart_s),
                    np.ones(n, bool), np.zeros(n, np.int64))
    seg = running_segments(events, np.array([chips]), np.zeros(1), horizon, config.checkpoint_s)
    return MethodResult(
        method="ddp", learners=1, chips=chips, seed=seed,
        goodput=float(seg.useful_chip_seconds().sum() / (chips * horizon)),
        uptime=float(seg.running_seconds().sum() / horizon),
    )
