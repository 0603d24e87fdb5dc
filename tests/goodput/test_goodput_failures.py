"""The failure process: per-slice Poisson rates, repair-time distributions, stationarity."""

from __future__ import annotations

import math

import numpy as np
import pytest

from ddiloco.goodput.config import SECONDS_PER_YEAR, GoodputConfig
from ddiloco.goodput.failures import (
    RepairTime,
    sample_job_failures,
    sample_outages,
    slice_sizes,
)


def test_slice_sizes_cover_every_chip_once():
    assert slice_sizes(1024, 256).tolist() == [256] * 4
    assert slice_sizes(1000, 256).tolist() == [256, 256, 256, 232]
    assert slice_sizes(5, 256).tolist() == [5]
    with pytest.raises(ValueError):
        slice_sizes(0, 256)


def test_failure_rate_is_chips_over_mtbi():
    # Instant repairs: a slice is (almost) always up, so its failures are Poisson(chips/MTBI * T).
    cfg = GoodputConfig(repair_dist="fixed", repair_mean_hours=1e-6, mtbi_years=1.0)
    chips, horizon = 256_000, 30 * 86400.0  # 1000 slices of 256 chips, 30 days
    out = sample_outages(chips, cfg, np.random.default_rng(1), horizon=horizon)
    n = int(((out.down_at >= 0) & (out.down_at < horizon)).sum())
    expected = chips / SECONDS_PER_YEAR * horizon  # about 21 000
    assert abs(n - expected) < 4 * math.sqrt(expected)


def test_bigger_slices_fail_proportionally_more_often():
    cfg = GoodputConfig(repair_dist="fixed", repair_mean_hours=1e-6, slice_chips=512)
    horizon = 30 * 86400.0
    # 200 slices of 512 chips and one last slice of 256: count per-slice failures.
    out = sample_outages(200 * 512 + 256, cfg, np.random.default_rng(2), horizon=horizon)
    counts = np.bincount(out.slice[out.down_at >= 0], minlength=out.num_slices)
    per_chip_big = counts[:-1].mean() / 512
    rate = horizon / SECONDS_PER_YEAR
    assert per_chip_big == pytest.approx(rate, rel=0.05)


def test_repair_down_time_follows_its_distribution():
    cfg = GoodputConfig(repair_mean_hours=2.0, repair_sigma=1.0, mtbi_years=0.25)
    out = sample_outages(256 * 2000, cfg, np.random.default_rng(3), horizon=20 * 86400.0)
    durations = (out.up_at - out.down_at)[out.down_at >= 0]
    assert durations.size > 10_000
    mean_s = 2.0 * 3600
    assert durations.mean() == pytest.approx(mean_s, rel=0.06)
    # Lognormal: median = mean * exp(-sigma^2 / 2), log-sd = sigma.
    assert np.median(durations) == pytest.approx(mean_s * math.exp(-0.5), rel=0.05)
    assert np.log(durations).std() == pytest.approx(1.0, rel=0.05)


@pytest.mark.parametrize("kind, cv", [("exponential", 1.0), ("fixed", 0.0), ("lognormal", math.sqrt(math.e - 1))])
def test_repair_time_kinds_have_the_requested_mean(kind, cv):
    r = RepairTime(kind, 600.0, sigma=1.0)
    x = r.sample(np.random.default_rng(4), 200_000)
    assert x.mean() == pytest.approx(600.0, rel=0.02)
    assert x.std() / x.mean() == pytest.approx(cv, abs=0.06)


def test_start_is_stationary_and_no_outage_overlaps_itself():
    cfg = GoodputConfig(mtbi_years=0.5, repair_mean_hours=4.0)
    out = sample_outages(256 * 3000, cfg, np.random.default_rng(5), horizon=86400.0)
    down0 = ((out.down_at < 0) & (out.up_at > 0)).sum() / out.num_slices
    mean_up = cfg.mtbi_s / 256
    expected = cfg.repair_mean_s / (mean_up + cfg.repair_mean_s)  # share of time a slice is down
    assert down0 == pytest.approx(expected, rel=0.15)
    # Per slice, outages are sorted and disjoint, and all touch [0, horizon).
    same = out.slice[1:] == out.slice[:-1]
    assert np.all(out.down_at[1:][same] >= out.up_at[:-1][same])
    assert np.all(out.up_at > 0) and np.all(out.down_at < 86400.0)


def test_same_seed_same_draw():
    cfg = GoodputConfig()
    a = sample_outages(100_000, cfg, np.random.default_rng(7), horizon=86400.0)
    b = sample_outages(100_000, cfg, np.random.default_rng(7), horizon=86400.0)
    assert np.array_equal(a.down_at, b.down_at) and np.array_equal(a.slice, b.slice)


def test_a_job_on_spares_fails_at_rate_chips_over_mtbi():
    rng = np.random.default_rng(8)
    counts = [sample_job_failures(1_200_000, SECONDS_PER_YEAR, 86400.0, rng).size for _ in range(50)]
    expected = 1_200_000 / 365  # failures per day
    assert np.mean(counts) == pytest.approx(expected, rel=4 / math.sqrt(50 * expected))
    t = sample_job_failures(1_200_000, SECONDS_PER_YEAR, 86400.0, rng)
    assert np.all(np.diff(t) >= 0) and t.min() >= 0 and t.max() < 86400.0
