"""Late work: a contribution that missed its fragment's round, merged into a later round instead of lost.

A learner's contribution is an outer gradient against the version it held at its snapshot. When it
reaches the synchronizer after that version's round has closed (a long link, a slow learner), the
paper's synchronizer refuses it and the learner overwrites its work. Here (`AlgorithmConfig.late`
"merge") it is added, as it is, to the fragment's next round: the round open now if there is one,
else a *carry* that the next round starts from. Its weight is its token weight divided by
(1 + staleness_discount * s), s being the versions between its base and the version it is merged
into; past `max_staleness` versions it is refused. Each piece of late work joins exactly one round.

A carry that no round takes (the other learners are gone) is merged on its own once it has waited
`CARRY_PERIODS` sync periods (H steps at the smoothed step time), so no accepted work is held forever.

In the run's final flush no later round will come, and every learner sends its last work at once; on
a long link those pieces arrive spread over seconds. Merged as they came (K = 1), each learner's last
work was applied on its own, one outer step after another, each with a whole round's RDA norm: on a
real 100 ms link 126 single-learner merges and 147k refused tokens in the final flush
(docs/algorithm.md, "The end of a run"). So in the final flush late work opens a *gathering* round at
once, and every round then waits for each live learner (asked for the fragment: it sends its work or
declines) at most `FINAL_GATHER_PERIODS` sync periods (counted from its opening, with or without a
quorum, and never past the flush's end: the driver's drain), and merges them all in one outer step.

Memory: one float32 running sum per fragment with late work, at most one copy of the owned
parameters in all; the contributions' own tensors are not kept.
Work taken already (a push sent again after a lost reply, or a later snapshot on the same base version
that repeats it) is refused as a duplicate (`taken`), never merged twice.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from .messages import Contribution, FragmentRequest, FragmentUpdate, RejectCode, SyncAction
from .round_sum import AccumulatorPool, RoundSum
from .rounds import LateWork, Round
from .weights import token_weight

STALE = RejectCode.STALE

if TYPE_CHECKING:
    from .config import AlgorithmConfig
    from .merge_job import MergeDue, MergeJob
    from .timing import GraceWindow

CARRY_PERIODS = 1.0  # a carry waits this many sync periods (H * step time) for a round to take it
MIN_CARRY_SECONDS = 0.05  # and never less, so a run with no step time yet does not merge at once
FINAL_GATHER_PERIODS = 2.0  # in the final flush a round waits at most this many sync periods for everyone
MIN_FINAL_GATHER_SECONDS = 1.0  # and at least this long (a link's round trips), however short the steps


@dataclass
class Carry:
    """Late work of one fragment waiting for the fragment's next round."""

    total: RoundSum
    since: float  # when the first piece arrived
    work: list[LateWork] = field(default_factory=list)


def late_weight(c: Contribution, staleness: int, discount: float) -> float:
    """Token weight (`weights.token_weight`) divided by 1 + discount * staleness."""
    return token_weight(c.tokens, c.steps) / (1.0 + discount * staleness)


def admit_late(
    total: RoundSum,
    work: list[LateWork],
    c: Contribution,
    norms: Mapping[str, float],
    staleness: int,
    discount: float,
) -> LateWork:
    """Add a late contribution to a running sum (a round's or a carry's); its tensors are then dropped."""
    w = late_weight(c, staleness, discount)
    total.add(c.outer_gradient, w, norms)
    item = LateWork(dataclasses.replace(c, outer_gradient={}), norms, staleness, w)
    work.append(item)
    return item


def carry_due(carry: Carry, sync_every: int, step_time: float) -> float:
    """When a carry no round has taken is merged on its own."""
    return carry.since + max(MIN_CARRY_SECONDS, CARRY_PERIODS * sync_every * step_time)


def gather_until(opened_at: float, sync_every: int, step_time: float, ends: float | None = None) -> float:
    """In the final flush: until when a round waits for every live learner's last work, never past
    `ends` (the flush's end: the driver's drain, less a merge's time)."""
    until = opened_at + max(MIN_FINAL_GATHER_SECONDS, FINAL_GATHER_PERIODS * sync_every * step_time)
    return until if ends is None else min(until, ends)


class LateRounds:
    """Mixed into `SynchronizerCore`: where late work goes (a round, a carry, or refused)."""

    config: AlgorithmConfig
    versions: dict[int, int]
    rounds: dict[int, Round]
    merging: dict[int, MergeJob]
    carries: dict[int, Carry]
    grace: GraceWindow
    sums: AccumulatorPool
    final_flush: bool
    flush_ends: float | None  # by when the final flush's rounds are merged (`begin_final_flush`)
    late_floor: dict[int, int]  # per fragment, the version restored at the last restart

    if TYPE_CHECKING:  # defined by `SynchronizerCore`

        def _rda_names(self, p: int) -> frozenset[str]: ...
        def _reject(
            self, learner: int, fragment: int | None, code: RejectCode, reason: str
        ) -> list[SyncAction | MergeDue]: ...
        def _update(self, p: int, learners: Sequence[int], copy: bool | None = None) -> FragmentUpdate: ...

    def _late(self, c: Contribution, norms: Mapping[str, float], now: float) -> list[SyncAction | MergeDue] | None:
        """Admit `c` as late work, or refuse it; None when it is not late (its round is open or to open)."""
        p, current = c.fragment, self.versions[c.fragment]
        merging = p in self.merging
        if c.base_version > current or (c.base_version == current and not merging):
            return None
        if self.config.late == "refuse":
            if c.base_version == current:  # its round is closed and being merged
                return self._reject(c.learner, p, STALE, f"stale: version {current} of fragment {p} is being merged")
            return self._reject(
                c.learner, p, STALE, f"stale: based on version {c.base_version}, current is {current}"
            ) + [self._update(p, (c.learner,))]
        if c.base_version < self.late_floor.get(p, 0):  # from before a restart: it may be merged already
            return self._reject(
                c.learner, p, STALE, f"stale: based on version {c.base_version}, from before the synchronizer restarted"
            ) + [self._update(p, (c.learner,))]
        staleness = current + (1 if merging else 0) - c.base_version  # versions it missed
        limit = self.config.max_staleness
        if staleness > limit:
            reason = (
                f"stale: based on version {c.base_version}, current is {current}: {staleness} versions late, "
                f"more than max_staleness S={limit}"
            )
            return self._reject(c.learner, p, STALE, reason) + [self._update(p, (c.learner,))]
        r = None if merging else self.rounds.get(p)
        carry = self.carries.get(p)
        held = r.late if r is not None else carry.work if carry is not None else []
        if any(w.contribution.learner == c.learner and w.contribution.base_version == c.base_version for w in held):
            return self._reject(c.learner, p, RejectCode.DUPLICATE, "duplicate contribution for this round")
        if r is not None:
            admit_late(r.total, r.late, c, norms, staleness, self.config.staleness_discount)
            return []
        if carry is None:
            carry = self.carries[p] = Carry(RoundSum(self._rda_names(p), self.sums), since=now)
        admit_late(carry.total, carry.work, c, norms, staleness, self.config.staleness_discount)
        return []

    def _take_carry(self, p: int) -> Carry | None:
        """The late work a round opening now starts from."""
        return self.carries.pop(p, None)

    live: set[int]

    def _carry_due(self, c: Carry) -> float:
        """When a carry no round has taken opens a round: at once in the final flush (no round may
        come; it opens a gathering round), else after `CARRY_PERIODS` sync periods (merged alone)."""
        return c.since if self.final_flush else carry_due(c, self.config.sync_every, self.grace.step_time.get())

    def _carry_deadlines(self) -> list[float]:
        """When each carry that no round can take now is merged on its own."""
        return [self._carry_due(c) for p, c in self.carries.items() if p not in self.rounds and p not in self.merging]

    def _open_due_carries(self, now: float) -> list[SyncAction]:
        """Turn carries that waited their time into rounds of their own: due at once, or in the final
        flush gathering rounds that ask every live learner not heard from for the fragment."""
        requests: list[SyncAction] = []
        for p in sorted(self.carries):
            c = self.carries[p]
            if p in self.rounds or p in self.merging or now < self._carry_due(c):
                continue
            del self.carries[p]
            if self.final_flush:
                heard = {w.contribution.learner for w in c.work}
                self.rounds[p] = Round(
                    version=self.versions[p],
                    opened_at=now,
                    expected=set(self.live),
                    total=c.total,
                    quorum_at=now,
                    deadline=self._gather_until(now),
                    late=c.work,
                )
                others = tuple(sorted(self.live - heard))
                if others:
                    requests.append(FragmentRequest(p, self.versions[p], others))
                continue
            self.rounds[p] = Round(
                version=self.versions[p],
                opened_at=c.since,
                expected=set(),
                total=c.total,
                quorum_at=now,
                deadline=now,
                late=c.work,
            )
        return requests

    def _gather_until(self, opened_at: float) -> float:
        return gather_until(opened_at, self.config.sync_every, self.grace.step_time.get(), self.flush_ends)
