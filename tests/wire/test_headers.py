"""The wire contract of a contribution (`wire.headers`): every refusal code round-trips and alone
decides what the learner does; the head the learner writes is the head the synchronizer reads, and
every number in it is range-checked where it enters."""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch

from ddiloco.core import Contribution, RejectCode
from ddiloco.wire import fields, framing
from ddiloco.wire.headers import ContributionHeader, Reply, WorkStamp, session_of
from ddiloco.wire.protocol import ACTIONS, REJECTION_ACTIONS, rejection_action

# What each code asks of the learner, written out by hand (`wire/protocol.py` is the rule book).
EXPECTED_ACTIONS = {
    "stale": "none",
    "duplicate": "none",
    "unknown_learner": "reregister",
    "unknown_session": "reregister",
    "not_owned": "reset",
    "unknown_version": "reset",
    "bad_counters": "reset",
    "bad_tensors": "reset",
    "non_finite": "reset",
    "too_large": "reset",
    "merge_refused": "reset",
    "malformed": "reset",
}
# Texts that would have fooled the old rule (it read the reason's first words), and none at all.
MISLEADING = ["stale: based on version 0", "duplicate contribution", "unknown session: register again", "", "NaN"]


def on_the_wire(head: dict) -> dict:
    """`head` as the other side reads it: framed, then parsed back."""
    return framing.read_message(framing.message(head))


def test_every_code_is_known_on_both_sides_and_has_an_action():
    assert {c.value for c in RejectCode} == set(EXPECTED_ACTIONS) == {c.value for c in REJECTION_ACTIONS}
    assert set(REJECTION_ACTIONS.values()) <= set(ACTIONS)
    assert len({c.value for c in RejectCode}) == len(RejectCode)  # no two codes share a value


@pytest.mark.parametrize("code", list(RejectCode), ids=lambda c: c.value)
@pytest.mark.parametrize("text", MISLEADING)
def test_each_code_round_trips_and_its_action_is_the_codes_whatever_the_text(code, text):
    reply = Reply.refused(code, text)
    received = Reply.decode(on_the_wire(reply.encode()))
    assert received == reply and received.code is code and received.reason == text
    assert received.action == rejection_action(code) == EXPECTED_ACTIONS[code.value]
    assert RejectCode(code.value) is code
    assert "action" not in reply.encode()  # the learner decides: the wire carries the code


def test_an_accepted_reply_and_replies_without_a_known_code():
    assert Reply.decode(on_the_wire(Reply().encode())) == Reply() and Reply().action == "none"
    for head in ({"ok": False}, {"ok": False, "code": "from-a-newer-synchronizer"}, {"ok": False, "code": 7}):
        reply = Reply.decode(on_the_wire(head))
        assert not reply.ok and reply.code is None and reply.action == "reset"  # as a reply without one did
    assert Reply.decode({"ok": "yes"}).ok is False and Reply.decode({"ok": False, "reason": 5}).reason == ""


def stamp(**changes: object) -> WorkStamp:
    values: dict = dict(position=48, tokens_total=12_288, final=False, span_start=1.7e9, snapshot_wall=1.7e9 + 3.5)
    values.update(changes)
    return WorkStamp(**values)


def contribution(**changes: object) -> Contribution:
    values: dict = dict(
        learner=2,
        fragment=1,
        base_version=3,
        outer_gradient={"w": torch.ones(2)},
        steps=4,
        tokens=256,
        seconds=0.75,
        step_time=0.1875,
        step=48,
        overlap=2,
        link_seconds=0.0123456789,
    )
    values.update(changes)
    return Contribution(**values)


@pytest.mark.parametrize(
    "c, s",
    [
        (contribution(), stamp()),
        (contribution(overlap=-1, link_seconds=0.0), stamp(tokens_total=None, final=True)),
    ],
)
def test_the_head_the_learner_writes_is_the_head_the_synchronizer_reads(c, s):
    header = ContributionHeader.of(c, s)
    assert header.link_seconds == round(c.link_seconds, 6)
    head = on_the_wire(header.encode("session-1"))
    assert head["kind"] == "contribution" and session_of(head) == "session-1"
    decoded = ContributionHeader.decode(head, now=0.0, max_overlap=3)
    assert decoded == header
    back = decoded.contribution(c.learner, c.outer_gradient)
    assert back == dataclasses.replace(c, link_seconds=header.link_seconds)


class Recording(dict):
    """A head that notes every key its reader asks for."""

    def __init__(self, *args: object) -> None:
        super().__init__(*args)
        self.asked: set[str] = set()

    def get(self, key, default=None):
        self.asked.add(key)
        return super().get(key, default)

    def __contains__(self, key: object) -> bool:
        self.asked.add(str(key))
        return super().__contains__(key)


def test_the_synchronizer_reads_every_key_the_learner_writes():
    head = Recording(ContributionHeader.of(contribution(), stamp()).encode("s"))
    ContributionHeader.decode(head, now=0.0, max_overlap=3)
    session_of(head)
    assert set(head) - {"kind"} <= head.asked  # kind is the handler's own check (`CONTRIBUTION`)


def test_missing_optional_fields_take_their_defaults():
    head = ContributionHeader.of(contribution(overlap=-1, link_seconds=0.0), stamp(tokens_total=None)).encode("s")
    for key in ("span_start", "snapshot_wall", "final", "link_seconds", "overlap", "tokens_total"):
        head.pop(key, None)
    decoded = ContributionHeader.decode(head, now=123.0, max_overlap=3)
    assert (
        decoded.overlap == -1
        and decoded.link_seconds == 0.0
        and decoded.stamp == WorkStamp(48, None, False, 123.0, 123.0)
    )


@pytest.mark.parametrize(
    "key, value",
    [
        ("fragment", -1),
        ("fragment", "0"),
        ("base_version", 2**53 + 1),
        ("steps", True),
        ("tokens", 1.5),
        ("step", None),
        ("position", 10**400),
        ("seconds", math.inf),
        ("seconds", fields.MAX_SECONDS * 2),
        ("step_time", fields.MAX_STEP_SECONDS + 1),
        ("step_time", -0.5),
        ("overlap", 4),  # the run's H - 1 is 3
        ("overlap", -1),  # absent means the run's; sent, it must be a tau
        ("link_seconds", fields.MAX_LINK_SECONDS + 1),
        ("tokens_total", -5),
        ("final", "yes"),
        ("span_start", fields.MAX_WALL * 2),
        ("snapshot_wall", math.nan),
    ],
)
def test_every_number_a_learner_sends_is_range_checked_and_the_field_named(key, value):
    head = ContributionHeader.of(contribution(), stamp()).encode("s")
    head[key] = value
    with pytest.raises(fields.BadField, match=repr(key)):
        ContributionHeader.decode(head, now=0.0, max_overlap=3)


@pytest.mark.parametrize(
    "key", ["fragment", "base_version", "steps", "tokens", "step", "position", "seconds", "step_time"]
)
def test_a_required_field_that_is_missing_is_named(key):
    head = ContributionHeader.of(contribution(), stamp()).encode("s")
    del head[key]
    with pytest.raises(fields.BadField, match=repr(key)):
        ContributionHeader.decode(head, now=0.0, max_overlap=3)


def test_a_message_over_the_limit_is_refused_by_its_type_not_its_text():
    from ddiloco.wire.reassembly import Reassembler

    frames = list(framing.tensor_frames({"kind": "contribution"}, {"w": torch.zeros(64)}, "fp32", 1 << 20))
    with pytest.raises(framing.MessageTooLarge) as info:
        Reassembler(limit=16).feed(frames[0])
    assert isinstance(info.value, framing.WireError)
    with pytest.raises(framing.WireError) as other:
        Reassembler(limit=1 << 20).feed(b"DDL" + bytes([framing.PROTOCOL_VERSION]) + b"\x00\x00\x00\x00")
    assert not isinstance(other.value, framing.MessageTooLarge)
