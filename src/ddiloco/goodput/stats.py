"""Mean and 95 % confidence interval over seeds (Student t, no SciPy needed)."""

from __future__ import annotations

import math
from collections.abc import Sequence

# Two-sided 95 % quantiles of Student's t for 1..30 degrees of freedom.
_T975 = (
    12.706,
    4.303,
    3.182,
    2.776,
    2.571,
    2.447,
    2.365,
    2.306,
    2.262,
    2.228,
    2.201,
    2.179,
    2.160,
    2.145,
    2.131,
    2.120,
    2.110,
    2.101,
    2.093,
    2.086,
    2.080,
    2.074,
    2.069,
    2.064,
    2.060,
    2.056,
    2.052,
    2.048,
    2.045,
    2.042,
)


def t975(dof: int) -> float:
    """0.975 quantile of Student's t; the normal 1.96 beyond 30 degrees of freedom (error < 2 %)."""
    if dof < 1:
        raise ValueError("need at least 1 degree of freedom")
    return _T975[dof - 1] if dof <= len(_T975) else 1.96


def mean_ci(values: Sequence[float]) -> tuple[float, float]:
    """(mean, half-width of its 95 % confidence interval); the half-width is 0 for one value."""
    n = len(values)
    if n == 0:
        raise ValueError("no values")
    mean = math.fsum(values) / n
    if n == 1:
        return mean, 0.0
    var = math.fsum((v - mean) ** 2 for v in values) / (n - 1)
    return mean, t975(n - 1) * math.sqrt(var / n)
