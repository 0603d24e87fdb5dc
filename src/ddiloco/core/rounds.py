"""A round of one fragment's merge, and the read-only view of it that status pages show."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from .messages import Contribution
from .round_sum import RoundSum


@dataclass(frozen=True)
class LateWork:
    """One late contribution inside a round or carry: its counters (tensors already summed)."""

    contribution: Contribution = field(repr=False)
    norms: Mapping[str, float] = field(repr=False)
    staleness: int  # versions between its base and the version its round merges from (>= 1)
    weight: float


@dataclass
class Round:
    """Collection of contributions for one (fragment, version)."""

    version: int
    opened_at: float
    expected: set[int]
    total: RoundSum  # the admitted contributions, summed as they arrive (their tensors are not kept)
    contributions: dict[int, Contribution] = field(default_factory=dict)  # counters only
    norms: dict[int, Mapping[str, float]] = field(default_factory=dict)  # per contributor, per tensor
    declined: set[int] = field(default_factory=set)
    quorum_at: float | None = None
    deadline: float | None = None
    late: list[LateWork] = field(default_factory=list)  # work that missed earlier rounds (`late`)
    overlap: int = -1  # the largest tau of the learners that formed the quorum (-1: the config's)
    link: float = 0.0  # and their largest link time (`timing.GraceWindow.slack`)


@dataclass(frozen=True)
class RoundView:
    """A read-only picture of an open round, for status pages and "why no quorum yet" logs."""

    fragment: int
    version: int
    opened_at: float
    quorum_at: float | None
    deadline: float | None
    need: int
    contributors: tuple[int, ...]
    declined: tuple[int, ...]
    waiting_for: tuple[int, ...]
    live: tuple[int, ...]
    late: tuple[int, ...] = ()  # learners whose late work this round also merges

    def describe(self, now: float) -> str:
        state = (
            f"quorum at {self.quorum_at - self.opened_at:.2f} s, grace until {self.deadline - self.opened_at:.2f} s"
            if self.quorum_at is not None and self.deadline is not None
            else f"no quorum after {now - self.opened_at:.2f} s"
        )
        return (
            f"fragment {self.fragment} version {self.version}: {state}: need {self.need} "
            f"(K capped at the live learners asked), contributions from {list(self.contributors)}, "
            f"waiting for {list(self.waiting_for)}, declined {list(self.declined)}, live {list(self.live)}"
        )
