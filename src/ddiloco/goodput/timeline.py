"""From events to running intervals: the one sweep every method's accounting is built on.

A group of slices (the whole job, or one learner) runs until an event stops it. Each event opens a
pause window [t, t + window): the job is hung, detecting, reconfiguring or restarting. Failures
strike running chips only, so the callers first move each failure past the failure pauses before
it (`failure_clock_shift`); a planned event (a repaired slice coming back) may still arrive during
a pause and extends it to its own end, so the pauses of a group are the union of its windows. Between pauses the
group runs with a constant number of live chips, because the live count only changes at events and
every event opens a pause. That makes all of the accounting a sorted sweep: np.maximum.accumulate
over window ends finds the pauses, np.cumsum over chip deltas finds the live chips.

Several groups are swept at once by shifting group g's times by g * span, so that no window of one
group can reach the next.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class Events:
    """Events of several groups; each opens a pause window and changes the group's live chips."""

    time: np.ndarray  # seconds, in [0, horizon)
    group: np.ndarray  # int, 0..num_groups-1
    window: np.ndarray  # seconds the group pauses from this event on
    failure: np.ndarray  # bool: a failure (loses the work in flight) or a planned event
    delta: np.ndarray  # chips going down (+) or coming back (-)

    @classmethod
    def concat(cls, *parts: Events) -> Events:
        return cls(
            *(np.concatenate([getattr(p, f) for p in parts]) for f in ("time", "group", "window", "failure", "delta"))
        )

    @classmethod
    def empty(cls) -> Events:
        return cls(np.zeros(0), np.zeros(0, np.int64), np.zeros(0), np.zeros(0, bool), np.zeros(0, np.int64))


@dataclass(frozen=True)
class Segments:
    """Running intervals [start, end) of each group, with their live chips and lost tail.

    `lost` is the part at the end of an interval whose work does not count: when a failure ends an
    interval, the work since the last commit point (a step boundary, or a checkpoint for the
    non-elastic job) is lost. Commit points are counted from the interval's start.
    """

    group: np.ndarray
    start: np.ndarray
    end: np.ndarray
    live: np.ndarray
    lost: np.ndarray
    ended_by_failure: np.ndarray
    num_groups: int
    horizon: float

    @property
    def length(self) -> np.ndarray:
        return self.end - self.start

    @property
    def productive(self) -> np.ndarray:
        """Seconds of each interval whose work counts."""
        return self.length - self.lost

    def useful_chip_seconds(self) -> np.ndarray:
        """Useful chip-seconds of each group."""
        return np.bincount(self.group, self.live * self.productive, minlength=self.num_groups)

    def running_seconds(self) -> np.ndarray:
        """Seconds each group is running (not paused), lost tails included."""
        return np.bincount(self.group, self.length, minlength=self.num_groups)

    def of_group(self, g: int) -> Segments:
        m = self.group == g
        return Segments(
            self.group[m],
            self.start[m],
            self.end[m],
            self.live[m],
            self.lost[m],
            self.ended_by_failure[m],
            self.num_groups,
            self.horizon,
        )


def lost_tail(length: np.ndarray, granularity: float) -> np.ndarray:
    """Work since the last commit point of an interval of this length (commits every granularity s)."""
    lost = np.mod(length, granularity)
    # Guard against float noise: an interval of exactly k commits loses nothing.
    close = np.isclose(lost, granularity, rtol=0.0, atol=1e-9 * max(1.0, granularity))
    return np.where(close, 0.0, lost)


def failure_clock_shift(time: np.ndarray, group: np.ndarray, window: np.ndarray) -> np.ndarray:
    """How much later each failure happens once interruptions strike running chips only.

    A chip is interrupted by what it runs into under load (a hardware fault that surfaces in a
    kernel, a link error in a collective, a crash of the job itself), so a group's failure clock
    stops while the group is paused for a failure: the k-th failure of a group lands the windows of
    its k - 1 earlier failures later than a wall-clock Poisson draw put it. Failure windows then
    never overlap, and each failure costs its own window once: the cost of a failure does not
    compound with the failure rate (docs/goodput.md). Returns the shift of each input failure.
    """
    if time.size == 0:
        return np.zeros(0)
    order = np.lexsort((time, group))
    grp, w = group[order], window[order]
    before = np.cumsum(w) - w  # windows of the earlier failures, across groups
    first_of_group = np.r_[True, grp[1:] != grp[:-1]]
    start = np.maximum.accumulate(np.where(first_of_group, np.arange(grp.size), 0))
    shift = np.empty(time.size)
    shift[order] = before - before[start]
    return shift


def running_segments(
    events: Events,
    group_chips: np.ndarray,
    initial_down: np.ndarray,
    horizon: float,
    granularity: float,
) -> Segments:
    """Sweep the events of every group into running intervals.

    group_chips[g]: chips of group g; initial_down[g]: its chips already down at time 0.
    granularity: seconds between commit points (a step, or a checkpoint interval).
    """
    num_groups = int(group_chips.size)
    group_chips = np.asarray(group_chips, dtype=np.float64)
    initial_down = np.asarray(initial_down, dtype=np.float64)
    n = events.time.size
    if n == 0:
        g = np.arange(num_groups)[group_chips > initial_down]
        z = np.zeros(g.size)
        return Segments(
            g,
            z,
            np.full(g.size, horizon),
            group_chips[g] - initial_down[g],
            z.copy(),
            np.zeros(g.size, bool),
            num_groups,
            horizon,
        )

    span = 2.0 * horizon + float(events.window.max()) + 1.0
    key = events.group * span + events.time
    # Sort by time; at equal times a failure comes first (it decides whether work is lost).
    order = np.lexsort((~events.failure, key))
    key = key[order]
    grp = events.group[order]
    time = events.time[order]
    fail = events.failure[order]
    delta = events.delta[order].astype(np.float64)

    reach = np.maximum.accumulate(key + events.window[order])  # end of the pause so far
    opens = np.ones(n, dtype=bool)
    opens[1:] = key[1:] > reach[:-1]
    first = np.flatnonzero(opens)  # first event of each pause
    last = np.r_[first[1:] - 1, n - 1]  # last event of each pause
    p_group = grp[first]
    p_start = time[first]
    p_end = np.minimum(reach[last] - p_group * span, horizon)

    # Chips down after each pause's last event: initial + cumulative delta within the group.
    csum = np.cumsum(delta)
    group_first = np.searchsorted(grp, np.arange(num_groups), side="left")
    base = np.where(group_first > 0, csum[np.maximum(group_first - 1, 0)], 0.0)
    down_after = initial_down[p_group] + csum[last] - base[p_group]

    # Running interval before each pause: from the previous pause's end (same group) or 0.
    same_as_prev = np.r_[False, p_group[1:] == p_group[:-1]]
    prev_end = np.where(same_as_prev, np.r_[0.0, p_end[:-1]], 0.0)
    prev_down = np.where(same_as_prev, np.r_[0.0, down_after[:-1]], initial_down[p_group])

    # Final interval of each group: from its last pause's end (or 0) to the horizon.
    last_of_group = np.r_[p_group[1:] != p_group[:-1], True]
    final_start = np.zeros(num_groups)
    final_down = initial_down.copy()
    final_start[p_group[last_of_group]] = p_end[last_of_group]
    final_down[p_group[last_of_group]] = down_after[last_of_group]

    g_all = np.r_[p_group, np.arange(num_groups)]
    start = np.r_[prev_end, final_start]
    end = np.r_[p_start, np.full(num_groups, horizon)]
    live = group_chips[g_all] - np.r_[prev_down, final_down]
    by_failure = np.r_[fail[first], np.zeros(num_groups, dtype=bool)]
    # A group with no live chip does not run, whatever its pauses say.
    keep = (end > start) & (live > 0)
    g_all, start, end, live, by_failure = (x[keep] for x in (g_all, start, end, live, by_failure))
    lost = np.where(by_failure, lost_tail(end - start, granularity), 0.0)
    order = np.lexsort((start, g_all))
    return Segments(
        g_all[order], start[order], end[order], live[order], lost[order], by_failure[order], num_groups, horizon
    )


def count_running(segments: Segments) -> tuple[np.ndarray, np.ndarray]:
    """How many groups run at each time: breakpoints t[0..k] and counts c[i] on [t[i], t[i+1])."""
    t = np.r_[segments.start, segments.end, 0.0, segments.horizon]
    d = np.r_[np.ones(segments.start.size), -np.ones(segments.end.size), 0.0, 0.0]
    order = np.lexsort((d, t))  # at equal times apply ends (-1) before starts (+1)
    t, d = t[order], d[order]
    count = np.cumsum(d)
    # Collapse equal times: keep the count after the last change at each time.
    last_at_time = np.r_[t[1:] != t[:-1], True]
    t, count = t[last_at_time], count[last_at_time]
    return t, count[:-1]


def low_windows(t: np.ndarray, count: np.ndarray, threshold: int) -> tuple[np.ndarray, np.ndarray]:
    """Maximal intervals [s, e) where count < threshold."""
    low = count < threshold
    if not low.any():
        return np.zeros(0), np.zeros(0)
    edges = np.diff(np.r_[0, low.astype(np.int8), 0])
    starts = np.flatnonzero(edges == 1)
    ends = np.flatnonzero(edges == -1)
    return t[starts], t[ends]
