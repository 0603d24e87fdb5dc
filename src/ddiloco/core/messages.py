"""Values that flow between the learner core and the synchronizer core.

Drivers move them: the virtual-clock cluster through an event queue, the networked runtime over the
wire. The cores never do I/O themselves; they take these in and hand these out.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import Enum
from typing import NamedTuple

import torch

Tensors = Mapping[str, torch.Tensor]


@dataclass(frozen=True)
class Contribution:
    """A learner's snapshot of one fragment, as an outer gradient against the version it holds.

    steps/tokens/seconds count the work since the learner last received this fragment; seconds is
    compute time, used for goodput accounting; step_time is the learner's smoothed step time, used
    for the grace window.
    """

    learner: int
    fragment: int
    base_version: int
    outer_gradient: Tensors = field(repr=False)
    steps: int
    tokens: int
    seconds: float
    step_time: float
    step: int
    overlap: int = -1  # the tau the learner uses (`learner.overlap`); -1: the config's
    link_seconds: float = 0.0  # its measured link time, snapshot to update back less the merge


@dataclass(frozen=True)
class Decline:
    """The learner was asked for a fragment but has nothing to give for that version."""

    learner: int
    fragment: int
    version: int
    reason: str


@dataclass(frozen=True)
class FragmentRequest:
    """Synchronizer -> learners: send your current value of `fragment` (version `version`)."""

    fragment: int
    version: int
    learners: tuple[int, ...]


@dataclass(frozen=True)
class FragmentUpdate:
    """Synchronizer -> learners: the global value of `fragment` at `version`. `merged`: the learners
    whose contributions the merge that made `version` took (None: not known, e.g. after a restart),
    so that a re-basing learner keeps work that was refused as stale instead of losing it. `owned`:
    nobody else holds `tensors` (decoded for this learner alone), so it may keep them as its base copy."""

    fragment: int
    version: int
    tensors: Tensors = field(repr=False)
    learners: tuple[int, ...]
    merged: tuple[int, ...] | None = None
    owned: bool = False


@dataclass(frozen=True)
class AdmittedWork:
    learner: int
    step: int  # the learner's step count at its snapshot: the work covers its last `steps` steps
    steps: int
    tokens: int
    seconds: float
    weight: float
    base_version: int = -1  # the version it was computed against (-1: the merge's own, on time)


@dataclass(frozen=True)
class Merged:
    """Record of one outer step, for logs and goodput accounting."""

    fragment: int
    version: int  # the new version
    time: float
    opened_at: float
    quorum_time: float
    grace: float
    admitted: tuple[AdmittedWork, ...]
    expected: int  # live learners asked for this round
    # L2 norms over the fragment: the merged outer gradient, and the contributions' (weighted mean).
    # Their ratio shows what the merge keeps: a plain mean of M orthogonal updates keeps 1/sqrt(M).
    merged_norm: float = 0.0
    contribution_norm: float = 0.0


class RejectCode(str, Enum):
    """Why a contribution was refused, as a code: what the wire carries and what a learner acts on
    (`wire.protocol.rejection_action`). The refusal's text says the same for people; nothing may
    depend on its wording. The values are the wire's: a new code is a new protocol version."""

    STALE = "stale"  # late work refused (`late="refuse"`, past max_staleness, from before a restart)
    DUPLICATE = "duplicate"  # work taken already (the same snapshot again, or one repeating its steps)
    UNKNOWN_LEARNER = "unknown_learner"  # the core does not count this learner as live
    UNKNOWN_SESSION = "unknown_session"  # the service does not know the session (restarted, declared gone)
    NOT_OWNED = "not_owned"  # the fragment belongs to another shard
    UNKNOWN_VERSION = "unknown_version"  # a base version newer than the current one
    BAD_COUNTERS = "bad_counters"  # no steps, negative or non-finite tokens, seconds or step time
    BAD_TENSORS = "bad_tensors"  # wrong names, shapes, dtypes or codec
    NON_FINITE = "non_finite"  # NaN or Inf values
    TOO_LARGE = "too_large"  # an outer gradient over max_outer_norm_ratio x the fragment's norm
    MERGE_REFUSED = "merge_refused"  # the round's merge would have made the fragment non-finite
    MALFORMED = "malformed"  # a header field of the wrong type or out of range


class Refusal(NamedTuple):
    """Why the synchronizer core refuses a contribution: the code, and the same for people."""

    code: RejectCode
    reason: str


@dataclass(frozen=True)
class Rejected:
    """A message the synchronizer refused; nothing changed. The driver tells the learner (the code)
    and logs it (the reason, for people)."""

    learner: int
    fragment: int | None
    reason: str
    code: RejectCode


LearnerMessage = Contribution | Decline
SyncAction = FragmentRequest | FragmentUpdate | Merged | Rejected
