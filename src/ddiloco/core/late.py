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

In the run's final flush no later round will come, and every learner sends its last work at once,
spread over a long link's delays. So then a carry opens a *gathering* round at once, and every round
waits for each live learner (asked for the fragment: it sends its work or declines) at most
`FINAL_GATHER_PERIODS` sync periods (counted from its opening, with or without a quorum, and never
past the flush's end: the driver's drain), and merges them all in one outer step (why:
docs/algorithm.md, "The end of a run").

With `stale_correction` on, each piece of late work is first corrected against the fragment's outer
momentum as it stands when the work is admitted (`stale_correction`: HeLoCo's rule).

Memory: one float32 running sum per fragment with late work, at most one copy of the owned
parameters in all; the contributions' own tensors are not kept.
Work taken already (a push sent again after a lost reply, or a later snapshot on the same base version
that repeats it) is refused as a duplicate (`taken`), never merged twice.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass, field

import torch

from .config import AlgorithmConfig
from .messages import Contribution, RejectCode
from .round_sum import RoundSum
from .rounds import LateWork, Round
from .stale_correction import correct_stale
from .timing import Ema
from .weights import token_weight

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


@dataclass(frozen=True)
class LateRefusal:
    """Why late work is refused, and whether its learner is sent the fragment's current version."""

    reason: str
    send_update: bool
    code: RejectCode = RejectCode.STALE


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
    """Where late work goes (the open round, a carry, or refused), and the carries until a round
    takes them. The synchronizer core owns the rounds; it asks `is_late` and `admit` of each
    contribution, `take` when a round opens, and `pop_due` for carries to open rounds of their own."""

    def __init__(
        self,
        config: AlgorithmConfig,
        step_time: Ema,
        new_sum: Callable[[int], RoundSum],
        momentum: Callable[[int], Mapping[str, torch.Tensor]] | None = None,
    ) -> None:
        """`step_time`: the smoothed step time (a carry waits sync periods of it); `new_sum`: an empty
        running sum for fragment p (a new carry's); `momentum`: fragment p's outer-momentum buffers,
        read (never written) by `stale_correction` when it is on."""
        self.config = config
        self.step_time = step_time
        self.new_sum = new_sum
        self.momentum = momentum
        self.carries: dict[int, Carry] = {}  # fragment -> late work waiting for its next round
        self.floor: dict[int, int] = {}  # per fragment, the version restored at the last restart

    @staticmethod
    def is_late(c: Contribution, current: int, merging: bool) -> bool:
        """Whether `c` missed its round: based on an older version than `current`, or on `current`
        while that version's round is being merged."""
        return c.base_version < current or (c.base_version == current and merging)

    def admit(
        self,
        c: Contribution,
        norms: Mapping[str, float],
        now: float,
        current: int,
        merging: bool,
        open_round: Round | None,
    ) -> LateRefusal | None:
        """Add late work `c` to `open_round` (the fragment's, if one is open) or to the fragment's
        carry, or refuse it (nothing is changed then). `current`: the fragment's version; `merging`:
        whether that version's round is being merged."""
        p = c.fragment
        if self.config.late == "refuse":
            if c.base_version == current:  # its round is closed and being merged
                return LateRefusal(f"stale: version {current} of fragment {p} is being merged", send_update=False)
            return LateRefusal(f"stale: based on version {c.base_version}, current is {current}", send_update=True)
        if c.base_version < self.floor.get(p, 0):  # from before a restart: it may be merged already
            return LateRefusal(
                f"stale: based on version {c.base_version}, from before the synchronizer restarted", send_update=True
            )
        staleness = current + (1 if merging else 0) - c.base_version  # versions it missed
        limit = self.config.max_staleness
        if staleness > limit:
            reason = (
                f"stale: based on version {c.base_version}, current is {current}: {staleness} versions late, "
                f"more than max_staleness S={limit}"
            )
            return LateRefusal(reason, send_update=True)
        r = None if merging else open_round
        carry = self.carries.get(p)
        held = r.late if r is not None else carry.work if carry is not None else []
        if any(w.contribution.learner == c.learner and w.contribution.base_version == c.base_version for w in held):
            return LateRefusal("duplicate contribution for this round", send_update=False, code=RejectCode.DUPLICATE)
        c, norms = self.corrected(c, norms)
        if r is not None:
            admit_late(r.total, r.late, c, norms, staleness, self.config.staleness_discount)
            return None
        if carry is None:
            carry = self.carries[p] = Carry(self.new_sum(p), since=now)
        admit_late(carry.total, carry.work, c, norms, staleness, self.config.staleness_discount)
        return None

    def corrected(self, c: Contribution, norms: Mapping[str, float]) -> tuple[Contribution, Mapping[str, float]]:
        """Late work `c` with `stale_correction` applied against its fragment's momentum (as it is, off)."""
        if not self.config.stale_correction or self.momentum is None:
            return c, norms
        values, new_norms = correct_stale(c.outer_gradient, norms, self.momentum(c.fragment))
        return dataclasses.replace(c, outer_gradient=values), new_norms

    def take(self, p: int) -> Carry | None:
        """The late work a round of fragment p opening now starts from."""
        return self.carries.pop(p, None)

    def due(self, carry: Carry, final_flush: bool) -> float:
        """When a carry no round has taken opens a round: at once in the final flush (no round may
        come; it opens a gathering round), else after `CARRY_PERIODS` sync periods (merged alone)."""
        return carry.since if final_flush else carry_due(carry, self.config.sync_every, self.step_time.get())

    def deadlines(self, busy: Collection[int], final_flush: bool) -> list[float]:
        """When each carry that no round can take now (its fragment not in `busy`: a round open or a
        merge in progress) opens a round of its own."""
        return [self.due(c, final_flush) for p, c in self.carries.items() if p not in busy]

    def pop_due(self, now: float, busy: Collection[int], final_flush: bool) -> list[tuple[int, Carry]]:
        """The carries, by fragment, that waited their time and now open rounds of their own."""
        out: list[tuple[int, Carry]] = []
        for p in sorted(self.carries):
            carry = self.carries[p]
            if p in busy or now < self.due(carry, final_flush):
                continue
            del self.carries[p]
            out.append((p, carry))
        return out

    def restart(self, versions: Mapping[int, int]) -> None:
        """The core was restored at `versions`: held work is gone (it is not saved, like an open round's),
        and late work based on an older version is refused (it may have been merged before)."""
        self.carries.clear()
        self.floor = dict(versions)
