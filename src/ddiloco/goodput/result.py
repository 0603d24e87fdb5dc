"""What one simulation of one method on one failure draw measures."""

from __future__ import annotations

from dataclasses import dataclass

METHODS = ("ddp", "elastic-ddp", "diloco", "decoupled")
"""Method names, the same as `ddiloco sim` uses."""


@dataclass(frozen=True)
class MethodResult:
    """Goodput and uptime of one method, one chip count, one learner count, one seed.

    goodput: useful chip-seconds / (chips * horizon): the share of allocated chip time whose work
        counts in the final model.
    uptime: the share of wall time in which training that feeds the global model is running.
    learners: 1 for the single-job methods (ddp, elastic-ddp).
    """

    method: str
    learners: int
    chips: int
    seed: int
    goodput: float
    uptime: float
