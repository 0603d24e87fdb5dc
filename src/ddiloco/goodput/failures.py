"""The failure process: when each slice goes down and when it comes back.

A chip's interruptions are a Poisson process of rate 1/MTBI. A slice is down as soon as one of its
chips is, so while it is up its failures are the superposition of its chips' processes: Poisson with
rate chips/MTBI. We therefore simulate slices, never chips. A failed slice stays down for a repair
time drawn from a configurable distribution; interruptions of its chips while it is down change
nothing. After the repair the slice's Poisson clock starts again (memoryless), so each slice is an
alternating renewal process: up ~ Exp(chips/MTBI), down ~ repair distribution.

Everything is generated with NumPy, all slices at once, a block of cycles at a time.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .config import GoodputConfig


@dataclass(frozen=True)
class RepairTime:
    """Down time of a failed slice: lognormal (default), exponential or fixed, with a given mean."""

    kind: str
    mean_s: float
    sigma: float = 1.0

    @classmethod
    def of(cls, config: GoodputConfig) -> RepairTime:
        return cls(config.repair_dist, config.repair_mean_s, config.repair_sigma)

    def sample(self, rng: np.random.Generator, size: int | tuple[int, ...]) -> np.ndarray:
        if self.kind == "fixed":
            return np.full(size, self.mean_s)
        if self.kind == "exponential":
            return rng.exponential(self.mean_s, size)
        if self.kind == "lognormal":
            # Parametrised by its mean: E[exp(mu + sigma Z)] = exp(mu + sigma^2 / 2).
            mu = np.log(self.mean_s) - 0.5 * self.sigma**2
            return rng.lognormal(mu, self.sigma, size)
        raise ValueError(f"unknown repair-time distribution {self.kind!r}")


@dataclass(frozen=True)
class SliceOutages:
    """All outages of all slices: slice `slice[i]` is down during [down_at[i], up_at[i]).

    Times are seconds from the start of the measured window [0, horizon). An outage may have begun
    before 0 (the slice is already down when the measurement starts) or end after the horizon.
    """

    slice: np.ndarray
    down_at: np.ndarray
    up_at: np.ndarray
    slice_chips: np.ndarray
    horizon: float

    @property
    def num_slices(self) -> int:
        return int(self.slice_chips.size)

    @property
    def chips(self) -> int:
        return int(self.slice_chips.sum())

    @classmethod
    def from_lists(
        cls, outages: list[tuple[int, float, float]], slice_chips: list[int], horizon: float
    ) -> SliceOutages:
        """Hand-written outages, for tests and examples: [(slice, down_at, up_at), ...]."""
        arr = np.array(outages, dtype=float).reshape(-1, 3)
        return cls(
            slice=arr[:, 0].astype(np.int64),
            down_at=arr[:, 1],
            up_at=arr[:, 2],
            slice_chips=np.asarray(slice_chips, dtype=np.int64),
            horizon=float(horizon),
        )


def slice_sizes(chips: int, slice_chips: int) -> np.ndarray:
    """Chips of each slice: full slices, and a smaller last one when chips is not a multiple."""
    if chips < 1:
        raise ValueError(f"chips must be >= 1, got {chips}")
    full, rest = divmod(chips, slice_chips)
    sizes = np.full(full + (1 if rest else 0), slice_chips, dtype=np.int64)
    if rest:
        sizes[-1] = rest
    return sizes


def burn_in_seconds(config: GoodputConfig) -> float:
    """How long to run the process before measuring, so that the start is (close to) stationary.

    Without it every slice would be up at time 0 and the first hours would flatter every method.
    Twenty mean repair times (and at least a day) let the long lognormal tail settle too.
    """
    return max(86400.0, 20.0 * config.repair_mean_s)


def sample_outages(
    chips: int,
    config: GoodputConfig,
    rng: np.random.Generator,
    horizon: float | None = None,
    burn_in: float | None = None,
) -> SliceOutages:
    """Draw every slice's outages over [-burn_in, horizon) and keep those that touch [0, horizon)."""
    horizon = config.horizon_s if horizon is None else float(horizon)
    burn_in = burn_in_seconds(config) if burn_in is None else float(burn_in)
    sizes = slice_sizes(chips, config.slice_chips)
    mean_up = config.mtbi_s / sizes  # mean up time of each slice, in seconds
    repair = RepairTime.of(config)
    span = horizon + burn_in
    expected_cycles = span / (mean_up.min() + repair.mean_s)
    block = int(min(max(4, 1.5 * expected_cycles + 4), 4096))

    todo = np.arange(sizes.size)
    clock = np.full(sizes.size, -burn_in)  # where each slice's next up period begins
    parts_slice, parts_down, parts_up = [], [], []
    while todo.size:
        up = rng.standard_exponential((todo.size, block)) * mean_up[todo, None]
        down = repair.sample(rng, (todo.size, block))
        ends = clock[todo, None] + np.cumsum(up + down, axis=1)
        fail = ends - down
        keep = (fail < horizon) & (ends > 0)
        rows, cols = np.nonzero(keep)
        parts_slice.append(todo[rows])
        parts_down.append(fail[rows, cols])
        parts_up.append(ends[rows, cols])
        clock[todo] = ends[:, -1]
        todo = todo[clock[todo] < horizon]
    order_slice = np.concatenate(parts_slice)
    order = np.lexsort((np.concatenate(parts_down), order_slice))
    return SliceOutages(
        slice=order_slice[order],
        down_at=np.concatenate(parts_down)[order],
        up_at=np.concatenate(parts_up)[order],
        slice_chips=sizes,
        horizon=horizon,
    )


def sample_job_failures(chips: int, mtbi_s: float, horizon: float, rng: np.random.Generator) -> np.ndarray:
    """Failure times of a job that always runs on `chips` healthy chips (failed slices swapped
    for spares at once): a Poisson process of rate chips/MTBI, whatever the repair times."""
    n = rng.poisson(chips / mtbi_s * horizon)
    return np.sort(rng.uniform(0.0, horizon, n))
