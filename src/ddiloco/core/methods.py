"""What each training method changes in the algorithm: one table, read by the simulator, the
synchronizer service and the launcher alike, so that `--method X` means the same everywhere.

Every DiLoCo-family method is this one core; a method fixes some knobs and leaves the others to the
user. `algorithm_for` applies the table (`fixed_knobs`); `default_merge` is the merge rule a method uses unless
`--merge` says otherwise.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from .config import AlgorithmConfig, MergeMode

METHODS: tuple[str, ...] = ("ddp", "elastic-ddp", "diloco", "streaming", "decoupled")
DILOCO_METHODS: tuple[str, ...] = ("diloco", "streaming", "decoupled")  # run on the synchronizer core
DATA_PARALLEL_METHODS: tuple[str, ...] = ("ddp", "elastic-ddp")  # no synchronizer: `algorithm_for` is a no-op


def algorithm_for(method: str, config: AlgorithmConfig, learners: int) -> AlgorithmConfig:
    """The algorithm `method` runs with `learners` learners, from the user's `config`.

    ==========  ==============  ============  ===========  ==========  ==============================
    method      fragments P     overlap tau   quorum K     grace       a learner waits
    ==========  ==============  ============  ===========  ==========  ==============================
    decoupled   as given        as given      as given     as given    never (tau = 0: at every sync)
    streaming   as given        as given      M (all)      0           when a fragment it sent is more
                                                                       than tau steps overdue
    diloco      1               0             M (all)      as given    at every sync (tau = 0)
    ddp, ...    (no synchronizer: the config is returned unchanged)
    ==========  ==============  ============  ===========  ==========  ==============================

    Streaming DiLoCo (Douillard et al. 2025) is the synchronous method with fragments and overlap:
    every learner's contribution in every round, and nobody runs past tau steps of overlap without the
    merged value (`synchronous`). Synchronous DiLoCo is its special case P = 1, tau = 0. Merge and the
    outer step are the user's; a method's default merge is `default_merge`.
    """
    return replace(config, **fixed_knobs(method, learners))


def fixed_knobs(method: str, learners: int) -> dict[str, Any]:
    """The `AlgorithmConfig` fields `method` sets, whatever the user asked (`algorithm_for`'s table).
    A command line applies them before it builds its config, so a knob the method ignores (tau with
    diloco) is never checked against the others."""
    if method not in METHODS:
        raise ValueError(f"unknown method {method!r}; choose one of {', '.join(METHODS)}")
    if learners < 1:
        raise ValueError(f"learners must be >= 1, got {learners}")
    if method == "diloco":
        return {"fragments": 1, "overlap": 0, "quorum": learners, "synchronous": True}
    if method == "streaming":
        return {"quorum": learners, "grace": 0.0, "synchronous": True}
    return {}


def default_merge(method: str) -> MergeMode:
    """Plain averaging of outer gradients for the synchronous methods (as the DiLoCo papers and
    torchft do); radial-directional averaging for decoupled, whose rounds admit a varying few."""
    return "mean" if method in ("diloco", "streaming") else "rda"
