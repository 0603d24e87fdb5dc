"""Cumulative work of each group as a function of wall time, for vectorised look-ups.

W_g(t) is the productive time group g has accumulated by time t (seconds of computation whose work
counts) and U_g(t) its useful chip-seconds. Both are piecewise linear. Synchronous DiLoCo asks
"when will learner g have done w more seconds of work after t0?" (the inverse of W) for every
learner at once, once per outer step; the quorum rule asks "how much useful work did g do in
[a, b)?". All groups live in one sorted array, group g shifted by g * span, so each question is
one np.searchsorted over all groups.
"""

from __future__ import annotations

import numpy as np

from .timeline import Segments


class Cumulative:
    """W_g(t) and U_g(t) of every group of a `Segments`, queried many groups at a time."""

    def __init__(self, segments: Segments) -> None:
        self.num_groups = segments.num_groups
        self.horizon = segments.horizon
        self.span = 2.0 * segments.horizon + 1.0
        prod = segments.productive
        keep = prod > 0
        g = np.r_[np.arange(self.num_groups), segments.group[keep]]
        s = np.r_[np.zeros(self.num_groups), segments.start[keep]]  # a zero-length opener per group
        length = np.r_[np.zeros(self.num_groups), prod[keep]]
        live = np.r_[np.zeros(self.num_groups), segments.live[keep]]
        order = np.lexsort((s, g))
        g, s, length, live = g[order], s[order], length[order], live[order]
        first = np.r_[True, g[1:] != g[:-1]]
        # Cumulative sums restarted at each group.
        w_end = np.cumsum(length)
        u_end = np.cumsum(length * live)
        group_base_w = np.maximum.accumulate(np.where(first, w_end - length, 0.0))
        group_base_u = np.maximum.accumulate(np.where(first, u_end - length * live, 0.0))
        self.group = g
        self.start = g * self.span + s
        self.length = length
        self.live = live
        self.w0 = g * self.span + (w_end - length - group_base_w)  # W at segment start, shifted
        self.w1 = self.w0 + length  # W at segment end, shifted
        self.u0 = u_end - length * live - group_base_u  # U at segment start
        self.total_work = np.bincount(g, length, minlength=self.num_groups)

    def _segment(self, groups: np.ndarray, t: np.ndarray) -> np.ndarray:
        return np.searchsorted(self.start, groups * self.span + t, side="right") - 1

    def work_at(self, groups: np.ndarray, t: np.ndarray) -> np.ndarray:
        """W_g(t): productive seconds of group g before time t."""
        j = self._segment(groups, t)
        inside = np.clip(groups * self.span + t - self.start[j], 0.0, self.length[j])
        return self.w0[j] - groups * self.span + inside

    def useful_at(self, groups: np.ndarray, t: np.ndarray) -> np.ndarray:
        """U_g(t): useful chip-seconds of group g before time t."""
        j = self._segment(groups, t)
        inside = np.clip(groups * self.span + t - self.start[j], 0.0, self.length[j])
        return self.u0[j] + self.live[j] * inside

    def time_for_work(self, groups: np.ndarray, work: np.ndarray) -> np.ndarray:
        """Earliest t with W_g(t) = work; inf when group g never does that much before the horizon."""
        target = groups * self.span + work
        j = np.searchsorted(self.w1, target, side="left")
        j_safe = np.minimum(j, self.start.size - 1)
        ok = (j < self.start.size) & (self.group[j_safe] == groups) & (work <= self.total_work[groups])
        t = self.start[j_safe] - groups * self.span + (target - self.w0[j_safe])
        return np.where(ok, t, np.inf)
