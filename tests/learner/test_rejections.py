"""A learner acts on a refusal by its code alone (`wire.headers.Reply`, `wire.protocol`): with the
reason's text changed, or swapped for another refusal's, it does the same. It used to read the action
the synchronizer chose, which the synchronizer chose from the reason's first words."""

from __future__ import annotations

import queue
import threading
from types import SimpleNamespace

import pytest
import torch

from ddiloco.core import Contribution, RejectCode
from ddiloco.learner.outbound import Outbound
from ddiloco.wire import framing
from ddiloco.wire.headers import Reply

# What the learner must do for each code, by hand: nothing, register again, or take the global value
# the synchronizer sends along (reset); "retry" is only for calls refused before any reply.
EXPECTED = {
    RejectCode.STALE: "none",
    RejectCode.DUPLICATE: "none",
    RejectCode.UNKNOWN_LEARNER: "reregister",
    RejectCode.UNKNOWN_SESSION: "reregister",
    RejectCode.NOT_OWNED: "reset",
    RejectCode.UNKNOWN_VERSION: "reset",
    RejectCode.BAD_COUNTERS: "reset",
    RejectCode.BAD_TENSORS: "reset",
    RejectCode.NON_FINITE: "reset",
    RejectCode.TOO_LARGE: "reset",
    RejectCode.MERGE_REFUSED: "reset",
    RejectCode.MALFORMED: "reset",
}
# Each another refusal's words (the old rule read "stale", "duplicate", "unknown session" first), or none.
TEXTS = ["stale: based on version 0, current is 2", "duplicate contribution", "unknown session: register again", ""]


def link(reply: dict | None = None) -> tuple[Outbound, list[str | None]]:
    """An `Outbound` with stand-ins for what acting on a reply uses of its link and context, and the
    sessions it invalidated."""
    invalidated: list[str | None] = []
    shard = SimpleNamespace(
        address="127.0.0.1:1",
        timeouts=SimpleNamespace(rpc=1.0),
        control=SimpleNamespace(call=lambda method, request, timeout: framing.message(reply or {})),
        contact=0.0,
        invalidate=invalidated.append,
    )
    ctx = SimpleNamespace(
        inbound=queue.Queue(),
        closing=threading.Event(),
        delay=lambda: None,
        wan=SimpleNamespace(delay=lambda: None),
    )
    stats = SimpleNamespace(accepted=0, rejected=0, bytes_pushed=0, last_rejection="")
    link_time = SimpleNamespace(observe_round_trip=lambda seconds: None)
    out = Outbound(0, shard, ctx, stats, None, link_time)  # type: ignore[arg-type]
    return out, invalidated


def contribution() -> Contribution:
    return Contribution(0, 1, 3, {"w": torch.zeros(2)}, 4, 64, 0.4, 0.1, 12)


@pytest.mark.parametrize("code", list(RejectCode), ids=lambda c: c.value)
def test_what_the_learner_does_is_chosen_by_the_code_whatever_the_text(code):
    done = set()
    for text in TEXTS:
        out, invalidated = link()
        wire = framing.read_message(framing.message(Reply.refused(code, text).encode()))  # as the link reads it
        out._answered(contribution(), Reply.decode(wire), "sid")
        kind, _, fragment, base, reason, action = out.ctx.inbound.get_nowait()
        assert (kind, fragment, base, reason) == ("rejected", 1, 3, text)
        assert invalidated == (["sid"] if action == "reregister" else [])
        assert out.stats.rejected == 1 and out.stats.last_rejection == text
        done.add(action)
    assert done == {EXPECTED[code]}  # one action per code, the same for every text


def test_an_accepted_reply_and_one_without_a_code_it_knows():
    out, invalidated = link()
    out._answered(contribution(), Reply.decode({"ok": True}), "sid")
    assert out.stats.accepted == 1 and out.ctx.inbound.empty()
    out._answered(contribution(), Reply.decode({"ok": False, "code": "newer", "reason": "stale"}), "sid")
    assert out.ctx.inbound.get_nowait()[-1] == "reset" and invalidated == []


@pytest.mark.parametrize("code", list(RejectCode), ids=lambda c: c.value)
def test_a_control_reply_makes_the_learner_register_again_by_its_code(code):
    for text in TEXTS:
        out, invalidated = link(Reply.refused(code, text).encode())
        assert out._call("Heartbeat", {"session": "sid"}, "sid") is not None
        assert invalidated == (["sid"] if EXPECTED[code] == "reregister" else [])
