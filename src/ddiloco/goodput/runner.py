"""Run every method on the same failure draws, over chip counts and seeds, and aggregate.

All methods and learner counts of one (chip count, seed) share one draw of slice outages (common
random numbers): differences between methods are then differences between methods, not between
draws, and a few seeds give tight intervals on the comparisons.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

import numpy as np

from .config import GoodputConfig
from .ddp import simulate_ddp
from .decoupled import simulate_decoupled
from .diloco import simulate_diloco
from .elastic import simulate_elastic_ddp
from .failures import sample_job_failures, sample_outages
from .result import METHODS, MethodResult
from .stats import mean_ci


def seed_rngs(chips: int, seed: int) -> tuple[np.random.Generator, ...]:
    """Independent streams, fixed by (seed, chips): slice failures, step-time noise, ddp's failures."""
    return tuple(np.random.default_rng(s) for s in np.random.SeedSequence([seed, chips]).spawn(3))


def simulate_seed(
    chips: int,
    learners: Sequence[int],
    config: GoodputConfig,
    seed: int,
    methods: Sequence[str] = METHODS,
) -> list[MethodResult]:
    """Every requested method on one failure draw."""
    fail_rng, step_rng, job_rng = seed_rngs(chips, seed)
    outages = sample_outages(chips, config, fail_rng)
    out: list[MethodResult] = []
    if "ddp" in methods:
        job_failures = sample_job_failures(chips, config.mtbi_s, config.horizon_s, job_rng)
        out.append(simulate_ddp(job_failures, chips, config.horizon_s, config, seed))
    if "elastic-ddp" in methods:
        out.append(simulate_elastic_ddp(outages, config, seed))
    for m in learners:
        if "diloco" in methods:
            out.append(simulate_diloco(outages, m, config, seed, rng=step_rng))
        if "decoupled" in methods:
            out.append(simulate_decoupled(outages, m, config, seed))
    return out


@dataclass(frozen=True)
class Summary:
    """One row of the output: a method at a chip count and learner count, over all seeds."""

    method: str
    learners: int
    chips: int
    goodput: float
    goodput_ci: float
    uptime: float
    uptime_ci: float
    seeds: int

    def as_json(self) -> dict[str, object]:
        return {
            "method": self.method,
            "learners": self.learners,
            "chips": self.chips,
            "goodput": round(self.goodput, 6),
            "goodput_ci": round(self.goodput_ci, 6),
            "uptime": round(self.uptime, 6),
            "uptime_ci": round(self.uptime_ci, 6),
            "seeds": self.seeds,
        }


def summarise(results: Iterable[MethodResult]) -> list[Summary]:
    """Mean and 95 % CI over seeds, one row per (method, learners, chips), in a stable order."""
    groups: dict[tuple[str, int, int], list[MethodResult]] = {}
    for r in results:
        groups.setdefault((r.method, r.learners, r.chips), []).append(r)
    rows = []
    for (method, learners, chips), rs in groups.items():
        g, g_ci = mean_ci([r.goodput for r in rs])
        u, u_ci = mean_ci([r.uptime for r in rs])
        rows.append(Summary(method, learners, chips, g, g_ci, u, u_ci, len(rs)))
    rows.sort(key=lambda s: (s.chips, METHODS.index(s.method), s.learners))
    return rows


@dataclass(frozen=True)
class RunReport:
    rows: list[Summary]
    results: list[MethodResult]
    wall_seconds: float


def run(
    chips: Sequence[int],
    learners: Sequence[int],
    config: GoodputConfig,
    seeds: int,
    first_seed: int = 0,
    methods: Sequence[str] = METHODS,
    on_done: Callable[[int, int], None] | None = None,
) -> RunReport:
    """Simulate every (chip count, seed); `on_done(chips, seed)` is called after each (progress)."""
    t = time.perf_counter()
    results: list[MethodResult] = []
    for n in chips:
        for s in range(first_seed, first_seed + seeds):
            results.extend(simulate_seed(n, learners, config, s, methods))
            if on_done is not None:
                on_done(n, s)
    return RunReport(summarise(results), results, time.perf_counter() - t)
