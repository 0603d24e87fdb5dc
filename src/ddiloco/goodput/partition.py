"""Which slices make up which learner."""

from __future__ import annotations

import numpy as np


def learner_of_slice(num_slices: int, learners: int) -> np.ndarray:
    """Contiguous, balanced blocks: learner m owns slices [m*S/M, (m+1)*S/M).

    Contiguous blocks keep a learner inside one datacenter-like unit, and doubling M splits each
    learner in two, so results for M = 2, 4, 8, 16 share their failure draws exactly.
    """
    if learners < 1:
        raise ValueError(f"learners must be >= 1, got {learners}")
    if num_slices < learners:
        raise ValueError(f"{learners} learners need at least {learners} slices, the cluster has {num_slices}")
    return (np.arange(num_slices, dtype=np.int64) * learners) // num_slices
