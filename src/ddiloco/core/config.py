"""The algorithm's knobs in one validated place, shared by every driver.

Defaults follow ALGORITHM.md (paper defaults where known; ours, documented, where not).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any, Literal

MergeMode = Literal["rda", "mean"]
ArrivalMode = Literal["auto", "overwrite", "rebase"]
LateMode = Literal["merge", "refuse"]


@dataclass(frozen=True)
class AlgorithmConfig:
    """Decoupled DiLoCo hyper-parameters.

    fragments (P), sync_every (H) and overlap (tau) set the schedule; quorum (K) and grace (gamma)
    the admission policy; outer_lr/outer_momentum the outer Nesterov step; merge the averaging rule
    ("rda": radial-directional averaging except embeddings, "mean": plain weighted average everywhere).
    max_outer_norm_ratio bounds one contribution: its outer gradient's norm may be at most this
    multiple of the fragment's norm (floored at an RMS of 0.1 per value, so a fragment of zeros can
    still learn), so no single learner can move the global model by orders of magnitude; 0 disables.
    final_momentum False: merges of the final flush (after the run's budget is reached) take a plain
    outer step lr * delta, without the momentum that would kick the last global model past the
    learners' own (`benchmarks/outer_sweep.py`, group last-merge).
    arrival: what a learner does with its fragment when a new global value arrives. "overwrite" (the
    paper's): theta <- Theta_new, and the steps taken since the snapshot are lost. "rebase" keeps
    them: theta <- Theta_new + (theta - theta_at_snapshot), counters keep the steps since the snapshot
    (a learner that did not contribute keeps all its unsent work: theta - its last Theta). "auto" (the
    default) re-bases wherever rounds average several learners (a grace window, or K > 1) and
    overwrites with K = 1 and no grace: there each round merges its opener alone, and re-based work
    would be applied learner after learner, a sum where the model wants an average (`rebases`;
    docs/results.md, "Keeping the work").
    quorum is capped at the number of live learners, so K >= M means "wait for every live learner".
    overlap 0 means blocking syncs: a learner waits at the boundary for the fragment it just sent
    (classic synchronous DiLoCo).
    synchronous: a learner waits for a fragment it sent once it is more than tau steps overdue, and
    contributes only on its own schedule (Streaming DiLoCo; `core.methods` sets it per method).
    overlap_auto: each learner widens its tau beyond `overlap` by the steps its link takes (the
    measured time to push a fragment and get the update back), so Eq. 3's slack stays positive behind
    a long link (`learner.overlap`); off, tau is `overlap` everywhere.
    late: what the synchronizer does with a contribution that missed its round (based on an older
    version than the current one). "merge" (ours, the default) adds it to the fragment's next round,
    counted once with its token weight divided by (1 + staleness_discount * s), s the versions it
    missed; one more than max_staleness (S) versions behind, it is refused. "refuse" is the paper's
    behaviour: late work is dropped and the learner overwritten (kept for the ablation).
    outer_debias (bias correction of the outer momentum), outer_restart_every (R, outer-momentum
    restarting) and outer_lr_per_learner (k): options of the outer step, each off by default, untried
    until measured (`core.outer`, docs/algorithm.md). With t the fragment's outer step (from 1), M the
    contributions it merges: outer_debias scales the momentum buffer's term by 1 / (1 - mu**t), so a
    constant outer gradient moves the model as far at the first steps as at steady state; R > 0 zeroes
    the buffer before every R-th step (0: never); k > 0 makes the step's lr outer_lr * (1 + k (M - 1)).
    stale_correction (HeLoCo's, off by default, untried until measured): late work (`late` "merge")
    is corrected tensor by tensor by its cosine with the fragment's outer momentum before it is
    summed: a tensor opposing the momentum loses part of its component along it, others are kept
    (`core.stale_correction`; docs/algorithm.md, "Outer-step options"). Work merged in its own round
    is never changed.
    """

    fragments: int = 24
    sync_every: int = 24
    overlap: int = 2
    quorum: int = 1
    grace: float = 0.9
    outer_lr: float = 0.7
    outer_momentum: float = 0.5  # benchmarks/outer_sweep.py; docs/results.md, "Choosing the outer step"
    merge: MergeMode = "rda"
    ema: float = 0.2
    max_outer_norm_ratio: float = 10.0
    final_momentum: bool = False  # measured: docs/results.md, "The end of a run"
    arrival: ArrivalMode = "auto"  # measured: docs/results.md, "Long links" and "Keeping the work"
    overlap_auto: bool = True
    late: LateMode = "merge"
    max_staleness: int = 4
    staleness_discount: float = 0.0
    synchronous: bool = False
    outer_debias: bool = False
    outer_restart_every: int = 0
    outer_lr_per_learner: float = 0.0
    stale_correction: bool = False

    def __post_init__(self) -> None:
        problems = []
        if self.fragments < 1:
            problems.append(f"fragments (P) must be >= 1, got {self.fragments}")
        if self.sync_every < 1:
            problems.append(f"sync_every (H) must be >= 1, got {self.sync_every}")
        if self.fragments > self.sync_every:
            problems.append(
                f"fragments (P={self.fragments}) must be <= sync_every (H={self.sync_every}): "
                "each fragment needs its own offset in 0..H-1"
            )
        if not 0 <= self.overlap < self.sync_every:
            problems.append(f"overlap (tau) must be in [0, H={self.sync_every}), got {self.overlap}")
        if self.quorum < 1:
            problems.append(f"quorum (K) must be >= 1, got {self.quorum}")
        if not 0 <= self.grace < 1:
            problems.append(f"grace (gamma) must be in [0, 1), got {self.grace}")
        if not self.outer_lr > 0:
            problems.append(f"outer_lr must be > 0, got {self.outer_lr}")
        if not 0 <= self.outer_momentum < 1:
            problems.append(f"outer_momentum must be in [0, 1), got {self.outer_momentum}")
        if self.merge not in ("rda", "mean"):
            problems.append(f"merge must be 'rda' or 'mean', got {self.merge!r}")
        if self.arrival not in ("auto", "overwrite", "rebase"):
            problems.append(f"arrival must be 'auto', 'overwrite' or 'rebase', got {self.arrival!r}")
        if self.late not in ("merge", "refuse"):
            problems.append(f"late must be 'merge' or 'refuse', got {self.late!r}")
        if not 1 <= self.max_staleness <= 1000:
            problems.append(f"max_staleness (S) must be in [1, 1000], got {self.max_staleness}")
        if not (0 <= self.staleness_discount < float("inf")):
            problems.append(f"staleness_discount must be a finite number >= 0, got {self.staleness_discount}")
        if not isinstance(self.overlap_auto, bool):
            problems.append(f"overlap_auto must be true or false, got {self.overlap_auto!r}")
        if not isinstance(self.synchronous, bool):
            problems.append(f"synchronous must be true or false, got {self.synchronous!r}")
        if not isinstance(self.final_momentum, bool):
            problems.append(f"final_momentum must be true or false, got {self.final_momentum!r}")
        if not 0 < self.ema <= 1:
            problems.append(f"ema must be in (0, 1], got {self.ema}")
        if not (self.max_outer_norm_ratio >= 0 and math.isfinite(self.max_outer_norm_ratio)):
            problems.append(f"max_outer_norm_ratio must be a finite number >= 0, got {self.max_outer_norm_ratio}")
        if not isinstance(self.outer_debias, bool):
            got = self.outer_debias
            problems.append(f"outer_debias (--outer-debias) must be true or false, got {got!r}")
        restart = self.outer_restart_every
        if isinstance(restart, bool) or not isinstance(restart, int) or not 0 <= restart <= 10**6:
            problems.append(
                f"outer_restart_every (--outer-restart-every) must be an integer in [0, 1e6], got {restart!r}"
            )
        if not (0 <= self.outer_lr_per_learner <= 1e6):
            problems.append(
                f"outer_lr_per_learner (--outer-lr-per-learner) must be in [0, 1e6], got {self.outer_lr_per_learner}"
            )
        if not isinstance(self.stale_correction, bool):
            got = self.stale_correction
            problems.append(f"stale_correction (--stale-correction) must be true or false, got {got!r}")
        if problems:
            raise ValueError("invalid algorithm config: " + "; ".join(problems))

    @property
    def rebases(self) -> bool:
        """Whether learners keep their in-flight steps when a global value arrives (`arrival`)."""
        if self.arrival == "auto":
            return self.grace > 0 or self.quorum > 1
        return self.arrival == "rebase"

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)
