"""Behind an emulated long link a learner keeps up to MAX_IN_FLIGHT pushes spending their latency side
by side, but never has more calls open at the synchronizer than its registration allows
(`pushes_per_session`): one more would be refused as RESOURCE_EXHAUSTED and taken for a broken link,
and at the end of a run that push's tokens would be lost in transit."""

from __future__ import annotations

import threading
import time
from types import SimpleNamespace

from ddiloco.learner.link import LinkStats
from ddiloco.learner.outbound import MAX_IN_FLIGHT, Outbound
from ddiloco.learner.overlap import LinkTime


def slots(width: int) -> Outbound:
    """A link's sending side on its own: of the link and its context only what `_server_slot` reads."""
    link = SimpleNamespace(timeouts=SimpleNamespace(heartbeat=1.0))
    ctx = SimpleNamespace(closing=threading.Event())
    outbound = Outbound(0, link, ctx, LinkStats(), None, LinkTime())  # type: ignore[arg-type]
    outbound.push_width = width
    return outbound


def test_open_calls_never_exceed_the_push_width_and_every_push_goes_through():
    link = slots(width=4)
    lock, open_now, most, done = threading.Lock(), [0], [0], []

    def push(i: int) -> None:
        with link._server_slot():
            with lock:
                open_now[0] += 1
                most[0] = max(most[0], open_now[0])
            time.sleep(0.05)
            with lock:
                open_now[0] -= 1
        done.append(i)

    threads = [threading.Thread(target=push, args=(i,)) for i in range(2 * MAX_IN_FLIGHT)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=30)
    assert sorted(done) == list(range(2 * MAX_IN_FLIGHT))
    assert most[0] <= 4 and link._at_server == 0


def test_a_failed_call_gives_its_slot_back():
    link = slots(width=1)
    try:
        with link._server_slot():
            raise RuntimeError("the call failed")
    except RuntimeError:
        pass
    assert link._at_server == 0
    with link._server_slot():  # free again (with the slot still held this would wait for good)
        assert link._at_server == 1
