"""The emulated wide-area link: its pacing by hand with a fake clock, then a real learner through it."""

import math
import threading
import time
from dataclasses import replace

import pytest

from ddiloco.learner.wan import DelayLine, LinkConfig, TokenBucket, WanLink

from ..support.runtime import ALGORITHM, LearnerThread, synchronizer, wait_for


class FakeTime:
    def __init__(self):
        self.now, self.slept = 0.0, []

    def clock(self):
        return self.now

    def sleep(self, seconds):
        self.slept.append(seconds)
        self.now += seconds


def test_the_token_bucket_lets_a_burst_through_then_paces_at_its_rate_by_hand():
    t = FakeTime()
    bucket = TokenBucket(rate=1000.0, burst=100.0, clock=t.clock, sleep=t.sleep)
    bucket.take(100)  # the burst: no wait
    assert t.slept == []
    bucket.take(500)  # 500 bytes at 1000 B/s
    assert t.slept == [pytest.approx(0.5)]
    t.now += 10.0  # idle: the bucket refills to its burst, not beyond
    bucket.take(300)
    assert t.slept[-1] == pytest.approx(0.2) and bucket.waited == pytest.approx(0.7)


def test_every_message_waits_the_latency_plus_a_jitter_within_its_bound():
    t = FakeTime()
    link = WanLink(LinkConfig(latency_ms=100.0, jitter_ms=50.0), seed=1, clock=t.clock, sleep=t.sleep)
    for _ in range(50):
        link.delay()
    assert all(0.1 <= s <= 0.15 for s in t.slept) and len(set(t.slept)) > 1
    assert link.up is None and list(link.paced_up([b"x" * 10])) == [b"x" * 10]  # no cap: frames pass
    capped = WanLink(LinkConfig(bandwidth_mb_s=1.0), clock=t.clock, sleep=t.sleep)
    assert capped.transfer_seconds(3_000_000) == pytest.approx(3.0)
    assert link.transfer_seconds(0) == pytest.approx(6 * 0.15)  # TLS's two round trips, there and back


@pytest.mark.parametrize("bad", [dict(latency_ms=-1.0), dict(bandwidth_mb_s=math.inf), dict(jitter_ms=math.nan)])
def test_bad_link_settings_are_refused(bad):
    with pytest.raises(ValueError, match="--net-.* must be a finite number"):
        LinkConfig(**bad)


@pytest.mark.timeout(120)
def test_a_learner_behind_a_slow_link_trains_and_its_uploads_take_at_least_bytes_over_bandwidth(tiny_task, tmp_path):
    rate = 200e3  # bytes per second each way
    wan = LinkConfig(latency_ms=5.0, bandwidth_mb_s=rate / 1e6, jitter_ms=5.0)
    algorithm = replace(ALGORITHM, quorum=2)  # K = M: the slow learner's work is waited for, not stale
    with synchronizer(tiny_task, tmp_path, algorithm=algorithm, tokens=2 * 48 * 64) as (service, address):
        learners = [
            LearnerThread(tiny_task, address, m, step_delay=0.01, wan=wan if m == 0 else None) for m in range(2)
        ]
        started = time.monotonic()
        for t in learners:
            t.start()
        for t in learners:
            t.join(90)
            assert not t.is_alive() and t.error is None, t.error
        elapsed = time.monotonic() - started
        wait_for(lambda: service.finished.is_set(), 10, message="the run to drain")
        status = service.status()
    slow = learners[0].client
    pushed = sum(link.stats.bytes_pushed for link in slow.links)
    received = sum(link.stats.bytes_received for link in slow.links)
    assert learners[0].result["accepted"] >= 1 and status["merges"] >= 2
    burst = rate * WanLink.BURST_SECONDS
    assert pushed / rate >= 0.5  # the cap mattered in this run
    assert elapsed >= (pushed - burst) / rate and elapsed >= (received - burst) / rate
    assert slow.ctx.wan.up.waited > 0 and slow.ctx.wan.down.waited > 0
    assert learners[1].client.ctx.wan.up is None  # the other learner's link is not emulated


def test_latency_is_propagation_messages_put_together_are_due_together_and_in_order_by_hand():
    t = FakeTime()
    link = WanLink(LinkConfig(latency_ms=100.0), clock=t.clock, sleep=t.sleep)
    line = DelayLine(link, lambda item: None, threading.Event(), clock=t.clock)
    line._thread = threading.Thread()  # no delivery thread: only the due times are looked at
    for item in range(3):
        line.put(item)
    assert [due for due, _ in line._queue.queue] == [pytest.approx(0.1)] * 3  # not 0.1, 0.2, 0.3
    jittery = DelayLine(
        WanLink(LinkConfig(latency_ms=100.0, jitter_ms=50.0), seed=3), lambda i: None, threading.Event()
    )
    jittery._thread = threading.Thread()
    for item in range(20):
        jittery.put(item)
    dues = [due for due, _ in jittery._queue.queue]
    assert dues == sorted(dues)  # jitter never reorders one stream


def test_a_delay_line_hands_items_on_in_order_no_sooner_than_the_latency():
    got, closing = [], threading.Event()
    line = DelayLine(
        WanLink(LinkConfig(latency_ms=50.0, jitter_ms=20.0), seed=1),
        lambda i: got.append((i, time.monotonic())),
        closing,
    )
    put_at = {}
    for item in range(5):
        put_at[item] = time.monotonic()
        line.put(item)
    wait_for(lambda: len(got) == 5, 10, message="the delayed items")
    closing.set()
    assert [i for i, _ in got] == list(range(5))
    assert all(at - put_at[i] >= 0.05 for i, at in got)
    now = []
    DelayLine(WanLink(), now.append, closing).put("now")  # no emulated link: handed on at once, in this thread
    assert now == ["now"]


def test_opening_a_connection_costs_a_round_trip_and_one_more_with_tls_by_hand():
    t = FakeTime()
    link = WanLink(LinkConfig(latency_ms=100.0), clock=t.clock, sleep=t.sleep)
    link.handshake()
    assert t.slept == [pytest.approx(0.2)]
    link.handshake(tls=True)
    assert t.slept[1:] == [pytest.approx(0.2)] * 2
