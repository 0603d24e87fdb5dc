"""Synchronous DiLoCo with M elastic learners: every outer step waits for every learner.

Each learner is an elastic data-parallel job over its N/M chips (see elastic.py): a failure pauses
it (detect + reconfigure + rejoin the outer group over the cross-datacenter network, the same
`rejoin_s` a Decoupled learner pays; the inner step in flight is lost), a repaired slice pauses it
again to scale up, and in between it keeps its state, so the inner steps it had done in the outer
step are kept. An outer step starts for everyone at once; learner m must do H inner steps, whose
total time varies from learner to learner (step-time variance, a normal approximation of the sum of
H steps with coefficient of variation `step_cv` each). The outer step ends when the slowest learner
is done, plus the blocking outer all-reduce (`outer_sync_s`). A learner that is done early idles:
that idle chip time is what synchronous DiLoCo loses to failures and stragglers.

The outer steps are sequential, so this is a loop over outer steps (about 12 000 in 7 days), each
one vectorised over learners with `Cumulative`; never a loop over chips or slices.
"""

from __future__ import annotations

import numpy as np

from .config import GoodputConfig
from .elastic import elastic_segments
from .failures import SliceOutages
from .partition import learner_of_slice
from .progress import Cumulative
from .result import MethodResult
from .timeline import Segments


def outer_step_work(rng: np.random.Generator, rounds: int, learners: int, config: GoodputConfig) -> np.ndarray:
    """Seconds of computation each learner needs for H inner steps, for `rounds` outer steps."""
    h = config.inner_steps
    z = rng.standard_normal((rounds, learners))
    factor = np.maximum(0.1, 1.0 + config.step_cv / np.sqrt(h) * z)
    return h * config.step_s * factor


def run_outer_steps(
    seg: Segments, config: GoodputConfig, rng: np.random.Generator
) -> tuple[float, np.ndarray, np.ndarray]:
    """Play the outer steps; return useful chip-seconds, outer-step starts, per-learner done times.

    The loop body is two np.searchsorted calls over all learners (W at the start, W^-1 at the
    target); the useful chip-seconds are looked up once for all outer steps afterwards.
    """
    cum = Cumulative(seg)
    m = seg.num_groups
    groups = np.arange(m)
    horizon = seg.horizon
    nominal = config.inner_steps * config.step_s + config.outer_sync_s
    block = max(16, int(horizon / nominal / 8) + 1)
    starts: list[float] = []
    done: list[np.ndarray] = []
    t0 = 0.0
    while t0 < horizon:
        for work in outer_step_work(rng, block, m, config):
            if not t0 < horizon:
                break
            finish = cum.time_for_work(groups, cum.work_at(groups, np.full(m, t0)) + work)
            starts.append(t0)
            done.append(finish)
            t0 = float(finish.max()) + config.outer_sync_s
    start_arr = np.asarray(starts)
    done_arr = np.minimum(np.asarray(done).reshape(-1, m), horizon)
    g = np.tile(groups, start_arr.size)
    useful = cum.useful_at(g, done_arr.reshape(-1)) - cum.useful_at(g, np.repeat(start_arr, m))
    return float(useful.sum()), start_arr, done_arr


def training_time(seg: Segments, starts: np.ndarray, done: np.ndarray) -> float:
    """Seconds in which at least one learner computes for the current outer step.

    Learner m computes for outer step k during [starts[k], done[k, m]) minus its pauses (a step
    lost to a failure was still computed, as for elastic-ddp's uptime). We intersect those two
    interval lists per learner and take the union over learners, all with +1/-1 sweeps (learner
    m's times shifted by m * span so that one sort serves all).
    """
    m = seg.num_groups
    span = 2.0 * seg.horizon + 1.0
    # Interval list A: outer-step work windows, per learner.
    a_g = np.tile(np.arange(m), starts.size)
    a_s = np.repeat(starts, m)
    a_e = done.reshape(-1)
    ok = a_e > a_s
    # Interval list B: the running intervals.
    b_e = seg.end
    okb = b_e > seg.start
    t = np.r_[
        a_g[ok] * span + a_s[ok],
        a_g[ok] * span + a_e[ok],
        seg.group[okb] * span + seg.start[okb],
        seg.group[okb] * span + b_e[okb],
    ]
    d = np.r_[np.ones(ok.sum()), -np.ones(ok.sum()), np.ones(okb.sum()), -np.ones(okb.sum())]
    order = np.lexsort((d, t))
    t, d = t[order], d[order]
    both = np.cumsum(d) == 2  # inside an A and a B interval of the same learner
    # Intervals [t[i], t[i+1]) where both hold; un-shift and take their union across learners.
    s = t[:-1][both[:-1]]
    e = t[1:][both[:-1]]
    grp = np.floor(s / span)
    s, e = s - grp * span, e - grp * span
    u = np.r_[s, e]
    du = np.r_[np.ones(s.size), -np.ones(e.size)]
    order = np.lexsort((-du, u))  # starts before ends at equal times: touching intervals merge
    u, du = u[order], du[order]
    active = np.cumsum(du) > 0
    return float(np.diff(u)[active[:-1]].sum())


def simulate_diloco(
    outages: SliceOutages,
    learners: int,
    config: GoodputConfig,
    seed: int = 0,
    rng: np.random.Generator | None = None,
) -> MethodResult:
    rng = np.random.default_rng(seed) if rng is None else rng
    groups = learner_of_slice(outages.num_slices, learners)
    seg = elastic_segments(outages, groups, config, extra_failure_pause=config.rejoin_s)
    useful, starts, done = run_outer_steps(seg, config, rng)
    return MethodResult(
        method="diloco",
        learners=learners,
        chips=outages.chips,
        seed=seed,
        goodput=useful / (outages.chips * outages.horizon),
        uptime=training_time(seg, starts, done) / outages.horizon,
    )
