"""The head of a contribution and of the reply to it, as both sides write and read them: one
definition of their keys, and the range checks where a learner's numbers enter the synchronizer.

A contribution's head (learner -> synchronizer, Push; `framing` adds "nbytes" and "tensors"):

    kind                      "contribution"
    session                   the session id of the learner's registration
    fragment, base_version    which fragment, and the version its outer gradient is against
    steps, tokens, seconds    the work since the learner last received the fragment (seconds: compute)
    step                      the learner's step count at its snapshot
    step_time                 its smoothed step time, s
    overlap                   its tau, in steps (absent: the run's)
    link_seconds              its measured link time, snapshot to update back less the merge (absent: 0)
    position                  its data stream's position at the snapshot
    tokens_total              the tokens it trained in all (absent: not told)
    final                     one of its last contributions, sent by `finish()` (absent: false)
    span_start, snapshot_wall the wall-clock span of the work (absent: when it arrives)

The reply (synchronizer -> learner): {"ok": true}, or {"ok": false, "code", "reason"}: the code
(`core.RejectCode`'s value) is what the learner acts on (`protocol.rejection_action`), the reason
the same for people. Control replies that refuse an unknown session carry the same three keys.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import torch

from ..core import Contribution, RejectCode
from . import fields
from .protocol import rejection_action

CONTRIBUTION = "contribution"  # the head's "kind"
SESSION = "session"


def session_of(head: Mapping[str, object]) -> object:
    """The session a head names, unchecked: the synchronizer looks it up (an unknown one, whatever it
    is, asks the learner to register again) before it checks the rest."""
    return head.get(SESSION)


@dataclass(frozen=True)
class WorkStamp:
    """What a learner's books say of a contribution, beside its counters: where its data stream stood,
    the tokens it trained in all, whether it is one of its last, and the wall-clock span it covers."""

    position: int
    tokens_total: int | None
    final: bool
    span_start: float
    snapshot_wall: float


@dataclass(frozen=True)
class ContributionHeader:
    """The head of a contribution, without its session (`encode` takes it) and its tensors."""

    fragment: int
    base_version: int
    steps: int
    tokens: int
    seconds: float
    step_time: float
    step: int
    overlap: int  # -1: the run's tau (not sent)
    link_seconds: float
    stamp: WorkStamp

    @classmethod
    def of(cls, c: Contribution, stamp: WorkStamp) -> ContributionHeader:
        """The head a learner sends with contribution `c`."""
        return cls(
            fragment=c.fragment,
            base_version=c.base_version,
            steps=c.steps,
            tokens=c.tokens,
            seconds=c.seconds,
            step_time=c.step_time,
            step=c.step,
            overlap=c.overlap,
            link_seconds=round(c.link_seconds, 6),
            stamp=stamp,
        )

    def encode(self, session: str) -> dict[str, Any]:
        """The JSON head on the wire."""
        head: dict[str, Any] = {"kind": CONTRIBUTION, SESSION: session}
        head.update((f.name, getattr(self, f.name)) for f in dataclasses.fields(self) if f.name != "stamp")
        head.update(dataclasses.asdict(self.stamp))
        if self.overlap < 0:
            del head["overlap"]
        if self.stamp.tokens_total is None:
            del head["tokens_total"]
        return head

    @classmethod
    def decode(cls, head: Mapping[str, object], *, now: float, max_overlap: int) -> ContributionHeader:
        """A head as the synchronizer takes it in: every number checked against its range (`fields`);
        `fields.BadField`, naming the field, for one out of it. `now` stands in for missing wall-clock
        stamps, `max_overlap` bounds the tau (the run's H - 1)."""
        return cls(
            fragment=fields.count(head, "fragment"),
            base_version=fields.count(head, "base_version"),
            steps=fields.count(head, "steps"),
            tokens=fields.count(head, "tokens"),
            seconds=fields.number(head, "seconds"),
            step_time=fields.number(head, "step_time", high=fields.MAX_STEP_SECONDS),
            step=fields.count(head, "step"),
            overlap=fields.count(head, "overlap", high=max_overlap, default=-1),
            link_seconds=fields.number(head, "link_seconds", high=fields.MAX_LINK_SECONDS, default=0.0),
            stamp=WorkStamp(
                position=fields.count(head, "position"),
                tokens_total=fields.optional_count(head, "tokens_total"),
                final=fields.flag(head, "final"),
                span_start=fields.wall_time(head, "span_start", now),
                snapshot_wall=fields.wall_time(head, "snapshot_wall", now),
            ),
        )

    def contribution(self, learner: int, outer_gradient: Mapping[str, torch.Tensor]) -> Contribution:
        """The core's contribution from this head, for `learner` (its session's)."""
        return Contribution(
            learner=learner,
            fragment=self.fragment,
            base_version=self.base_version,
            outer_gradient=outer_gradient,
            steps=self.steps,
            tokens=self.tokens,
            seconds=self.seconds,
            step_time=self.step_time,
            step=self.step,
            overlap=self.overlap,
            link_seconds=self.link_seconds,
        )


@dataclass(frozen=True)
class Reply:
    """The synchronizer's answer to a contribution (and the refusal part of a control reply)."""

    ok: bool = True
    code: RejectCode | None = None  # a refusal's; None: accepted, or a code this side does not know
    reason: str = ""  # the refusal for people: logs only, never acted on

    @classmethod
    def refused(cls, code: RejectCode, reason: str) -> Reply:
        return cls(False, code, reason)

    @property
    def action(self) -> str:
        """What the learner does (`protocol.ACTIONS`): "none" when accepted, else by the code alone."""
        return "none" if self.ok else rejection_action(self.code)

    def encode(self) -> dict[str, Any]:
        if self.ok:
            return {"ok": True}
        head: dict[str, Any] = {"ok": False, "reason": self.reason}
        if self.code is not None:
            head["code"] = self.code.value
        return head

    @classmethod
    def decode(cls, head: Mapping[str, object]) -> Reply:
        """A reply as the learner reads it: a code it does not know (or none) reads as None (reset)."""
        if head.get("ok") is True:
            return cls()
        code = head.get("code")
        known = {c.value: c for c in RejectCode}
        reason = head.get("reason")
        return cls(False, known.get(code) if isinstance(code, str) else None, reason if isinstance(reason, str) else "")
