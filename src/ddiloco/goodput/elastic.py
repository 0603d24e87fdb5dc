"""Elastic data-parallel: pause to drop a failed slice, go on with the live ones, pause to scale up.

The same accounting serves the learners of both DiLoCo variants: each learner is itself an elastic
data-parallel job over its own slices (a group). A failure hangs the group until it is detected and
then reconfigures it (window detect + reconfig (+ extra)); the step in flight is lost. Failures
strike running chips only (`timeline.failure_clock_shift`), so no failure lands inside another's
pause; a failed slice's repair keeps its length. A repaired slice is taken back with a planned
scale-up pause (window scaleup), which loses nothing: the scale-up waits for the step boundary.
Both pauses stop every slice of the group.
"""

from __future__ import annotations

import numpy as np

from .config import GoodputConfig
from .failures import SliceOutages
from .result import MethodResult
from .timeline import Events, Segments, failure_clock_shift, running_segments


def slice_events(
    outages: SliceOutages,
    slice_group: np.ndarray,
    failure_window: float,
    return_window: float,
) -> tuple[Events, np.ndarray]:
    """Events of every group in [0, horizon), and each group's chips already down at time 0."""
    h = outages.horizon
    chips = outages.slice_chips[outages.slice]
    groups = slice_group[outages.slice]
    num_groups = int(slice_group.max()) + 1 if slice_group.size else 0
    # Failures move onto the group's running clock; each repair keeps its length (it starts later).
    starts = (outages.down_at >= 0) & (outages.down_at < h)
    shift = np.zeros(outages.down_at.size)
    shift[starts] = failure_clock_shift(
        outages.down_at[starts], groups[starts], np.full(int(starts.sum()), float(failure_window))
    )
    down_at, up_at = outages.down_at + shift, outages.up_at + shift
    f = (down_at >= 0) & (down_at < h)
    r = (up_at >= 0) & (up_at < h) & (down_at < up_at)
    fails = Events(down_at[f], groups[f], np.full(f.sum(), float(failure_window)), np.ones(f.sum(), bool), chips[f])
    backs = Events(up_at[r], groups[r], np.full(r.sum(), float(return_window)), np.zeros(r.sum(), bool), -chips[r])
    down0 = (outages.down_at < 0) & (outages.up_at > 0)
    initial_down = np.bincount(groups[down0], chips[down0], minlength=num_groups)
    return Events.concat(fails, backs), initial_down


def elastic_segments(
    outages: SliceOutages,
    slice_group: np.ndarray,
    config: GoodputConfig,
    extra_failure_pause: float = 0.0,
) -> Segments:
    """Running intervals of each group of slices, each group elastic over its own slices."""
    events, initial_down = slice_events(
        outages,
        slice_group,
        failure_window=config.detect_s + config.reconfig_s + extra_failure_pause,
        return_window=config.scaleup_s,
    )
    num_groups = int(slice_group.max()) + 1
    group_chips = np.bincount(slice_group, outages.slice_chips, minlength=num_groups)
    return running_segments(events, group_chips, initial_down, outages.horizon, config.step_s)


def simulate_elastic_ddp(outages: SliceOutages, config: GoodputConfig, seed: int = 0) -> MethodResult:
    """One elastic job over all slices."""
    seg = elastic_segments(outages, np.zeros(outages.num_slices, dtype=np.int64), config)
    allocated = outages.chips * outages.horizon
    return MethodResult(
        method="elastic-ddp",
        learners=1,
        chips=outages.chips,
        seed=seed,
        goodput=float(seg.useful_chip_seconds().sum() / allocated),
        uptime=float(seg.running_seconds().sum() / outages.horizon),
    )
