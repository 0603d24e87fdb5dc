"""`--overlap auto`: tau from the measured link, by hand, then a real learner behind an emulated link."""

import math
from dataclasses import replace

import pytest

from ddiloco.core.timing import GraceWindow
from ddiloco.learner.overlap import LinkTime, OverlapChooser, choose_overlap
from ddiloco.learner.wan import LinkConfig

from ..support.runtime import ALGORITHM, LearnerThread, synchronizer, wait_for


def test_tau_is_tau0_plus_the_steps_the_link_takes_within_its_bounds_by_hand():
    assert choose_overlap(2, 24, 0.1, 0.0) == 2  # loopback: the paper's tau
    assert choose_overlap(2, 24, 0.1, 0.44) == 2 + 5  # 0.44 s at 0.1 s a step: 5 more steps
    assert choose_overlap(2, 24, 0.1, 0.5) == 2 + 5  # exactly 5 steps (no float rounding up to 6)
    assert choose_overlap(2, 24, 0.1, 5.0) == 23  # capped at H - 1, the schedule's bound
    assert choose_overlap(0, 24, 0.1, 5.0) == 0  # blocking syncs wait instead
    assert choose_overlap(2, 24, 0.0, 5.0) == 2  # no step time yet
    assert choose_overlap(2, 24, 0.1, math.inf) == 2
    assert choose_overlap(2, 4, 0.1, 5.0) == 3
    assert choose_overlap(3, 3, 0.1, 5.0) == 3  # H - 1 below tau_0: tau_0 stays


def test_the_link_time_is_the_push_plus_its_bytes_again_by_hand():
    link = LinkTime(alpha=1.0)
    assert link.seconds() == 0.0
    link.observe_round_trip(0.2)
    assert link.seconds() == pytest.approx(0.2)  # nothing pushed yet
    link.observe_push(0.44)  # a connection's round trip, the way there and back, 0.04 s of bytes
    assert link.seconds() == pytest.approx(0.44 + 0.04)
    link.observe_push(0.3)  # under two round trips: no bytes to add
    assert link.seconds() == pytest.approx(0.3)


def test_the_chooser_records_each_change_and_why_and_a_fixed_tau_never_moves():
    auto = OverlapChooser(2, 24, auto=True)
    assert auto.update(0.1, 0.0) == 2 and auto.changes == []
    assert auto.update(0.1, 0.44) == 7
    assert auto.changes[-1]["from"] == 2 and auto.changes[-1]["tau"] == 7
    assert "ceil(link 0.440 s / step 0.100 s)" in auto.summary()["why"]
    fixed = OverlapChooser(3, 24, auto=False)
    assert fixed.update(0.1, 10.0) == 3 and fixed.changes == [] and "fixed" in fixed.reason()


def test_the_grace_window_spends_tau_steps_less_the_link_by_hand():
    window = GraceWindow(overlap=2, gamma=0.5, alpha=1.0)
    window.step_time.update(0.1)
    assert window.length(0.0) == pytest.approx(0.5 * 0.2)  # the config's tau, no link
    assert window.length(0.0, overlap=7, link=0.44) == pytest.approx(0.5 * (0.7 - 0.44))
    assert window.length(0.0, overlap=2, link=0.44) == 0.0  # a fixed tau behind a long link: no slack


@pytest.mark.timeout(120)
def test_a_learner_behind_a_slow_link_widens_its_tau_by_the_steps_its_link_takes(tiny_task, tmp_path):
    latency = 0.15
    algorithm = replace(ALGORITHM, overlap_auto=True, sync_every=24, fragments=2)
    with synchronizer(tiny_task, tmp_path, algorithm=algorithm, tokens=10**9) as (service, address):
        slow = LearnerThread(tiny_task, address, 0, step_delay=0.01, wan=LinkConfig(latency_ms=latency * 1000))
        fast = LearnerThread(tiny_task, address, 1, step_delay=0.01)
        for t in (slow, fast):
            t.start()
        # at least one push and one heartbeat measured behind the slow link
        wait_for(slow.links_measured, 60, message="a measured push")
        wait_for(lambda: slow.client.overlap is not None and slow.client.overlap.tau > 2, 60, message="a wider tau")
        chooser = slow.client.overlap

        def wider_tau_heard() -> int | None:
            """The tau the synchronizer last heard, once wider: a heartbeat sent before tau widened (its
            progress taken a latency before it lands) may be the last it has at first."""
            tau = service.status()["learners"].get("0", {}).get("overlap") or 0
            return tau if tau >= 3 else None

        seen = wait_for(wider_tau_heard, 30, message="the wider tau in a heartbeat")
        for t in (slow, fast):
            t.halt.set()
        for t in (slow, fast):
            t.join(60)
            assert t.error is None, t.error
    # every push behind it waits the way there and the reply's way back: the link is at least 2 latencies
    assert chooser.link_seconds >= 2 * latency
    assert chooser.tau >= min(23, 2 + math.ceil(2 * latency / chooser.step_seconds - 1e-9))
    assert seen >= 3 and chooser.changes and "link" in chooser.changes[-1]["why"]
