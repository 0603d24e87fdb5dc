"""Confidence intervals over seeds."""

import math

import pytest

from ddiloco.goodput.stats import mean_ci, t975


def test_mean_ci_by_hand():
    # values 1, 2, 3: mean 2, sd 1, half-width t(2) * 1 / sqrt(3).
    mean, half = mean_ci([1.0, 2.0, 3.0])
    assert mean == 2.0 and half == pytest.approx(4.303 / math.sqrt(3))


def test_one_seed_has_no_interval_and_large_samples_use_the_normal():
    assert mean_ci([0.5]) == (0.5, 0.0)
    assert t975(100) == 1.96 and t975(1) == pytest.approx(12.706)
    with pytest.raises(ValueError):
        mean_ci([])
