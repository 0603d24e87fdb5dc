"""The staggered schedule: fragment p is sent every H learner steps, at its own offset t_p.

Each learner keeps, per fragment, an anchor step; fragment p is due when the learner has taken H
steps since its anchor. The anchor is set when the learner joins (so that fragment p is first due at
step t_p + H - tau, and arrives about tau steps later, at t_p modulo H) and moves to the step of each
snapshot it sends. The synchronizer additionally pulls a fragment from every other live learner as
soon as one learner sends it, so the pace is set by the fastest learner and nobody waits.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Schedule:
    num_fragments: int
    period: int  # H
    overlap: int  # tau

    def __post_init__(self) -> None:
        if not 1 <= self.num_fragments <= self.period:
            raise ValueError(f"need 1 <= P <= H, got P={self.num_fragments}, H={self.period}")
        if not 0 <= self.overlap < self.period:
            raise ValueError(f"need 0 <= tau < H, got tau={self.overlap}, H={self.period}")

    def offset(self, fragment: int) -> int:
        """t_p: distinct offsets spread evenly over 0..H-1."""
        if not 0 <= fragment < self.num_fragments:
            raise IndexError(f"fragment {fragment} out of range 0..{self.num_fragments - 1}")
        return (fragment * self.period) // self.num_fragments

    def initial_anchor(self, fragment: int, join_step: int) -> int:
        """Anchor at join, so that the first send of p happens at join_step + t_p + H - tau."""
        return join_step + self.offset(fragment) - self.overlap

    def is_due(self, step: int, anchor: int) -> bool:
        return step - anchor >= self.period
