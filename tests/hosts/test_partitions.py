"""Partitions under a real run (docs/runtime.md, "Partitions"): a learner cut off both ways for 20 s,
one way only, a shard cut off from every learner, a flapping link. Each checks the invariants:

- no token is double-counted (`double_merged_steps` 0 on every shard);
- the other learners never stall longer than the documented bound: failure timeout + grace + slack;
- the cut-off learner rejoins and its work is merged once or counted lost (merged <= trained);
- a half-open connection is noticed within the failure timeout (+ the timer's tick and slack);
- no process is left behind (the `make_network` fixture checks it after each test).

Every quorum is the number of learners (`--quorum 2`), so a round waits for the cut-off learner until
it is declared gone: the stall bound rests on the failure detection, not on a quorum of one.
"""

from __future__ import annotations

import time

import pytest

from ..support.processes import journals
from .cluster import FAILURE, GRACE, Cluster, longest_gap, names

LINK = "rate=100mbit,latency=5ms"
SLACK = 3.0  # a loaded 2-core machine: the timer's tick, a step, a push (never a bound below this)
STALL_BOUND = FAILURE + GRACE + SLACK  # the others' longest gap without a merge of their work


def check_books(cluster: Cluster, summaries: list[dict]) -> None:
    """No step merged twice on any shard; what each learner got merged is at most what it trained."""
    for summary in summaries:
        assert summary["double_merged_steps"] == 0
        for m in range(cluster.learners):
            trained = sum(j["tokens"] for j in journals(cluster.tmp, m))  # the learner's own journal
            merged = summary["books"][str(m)]["tokens_merged"]
            assert 0 < merged <= trained + 1e-6, (m, merged, trained)  # the rest: counted lost


def cut_and_heal(net, host: str, direction: str, seconds: float) -> tuple[float, float]:
    cut_at = time.time()
    net.cut(host, direction)
    time.sleep(seconds)
    healed_at = time.time()
    net.heal(host)
    return cut_at, healed_at


def noticed_within(cluster: Cluster, learner: int, cut_at: float, shard: int = 0) -> float:
    """How long after the cut shard `shard` declared `learner` gone (its connection half-open); 0 if
    the learner held no session there when the cut came (on a loaded machine a late heartbeat can end
    a session just before it, with a 1.2 s failure timeout: then there is nothing left to notice)."""
    before = [e for e in cluster.events(shard) if e["kind"] in ("join", "leave") and e.get("learner") == learner]
    before = [e for e in before if e["t"] < cut_at]
    if before and before[-1]["kind"] == "leave":
        return 0.0
    gone = [e for e in cluster.leaves(learner, shard) if e["t"] >= cut_at and "heartbeat" in e["reason"]]
    assert gone, f"shard {shard} never noticed learner {learner} was cut off (events: {before[-3:]})"
    return gone[0]["t"] - cut_at


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_a_learner_cut_off_20s_both_ways_stalls_nobody_and_rejoins(make_network, tmp_path, shakespeare):
    net = make_network(names(2, 1), LINK)
    c = Cluster(net, tmp_path, shakespeare, duration=45)
    c.wait_merged(1)
    cut_at, healed_at = cut_and_heal(net, "learner1", "both", 20.0)
    c.wait_merged(1, after=healed_at)  # its work reaches the global model again
    summaries = c.finish()
    assert noticed_within(c, 1, cut_at) <= FAILURE + SLACK
    assert longest_gap([e["t"] for e in c.merges(0)], cut_at, healed_at) <= STALL_BOUND
    assert [e for e in c.joins(1) if e["t"] > healed_at], "learner 1 did not register again after the heal"
    check_books(c, summaries)
    assert net.counters("learner1")["sent_dropped"] > 0


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_one_way_cuts_are_noticed_within_the_failure_timeout(make_network, tmp_path, shakespeare):
    net = make_network(names(2, 1), LINK)
    c = Cluster(net, tmp_path, shakespeare, duration=50)
    c.wait_merged(1)
    # what learner 1 sends is lost, what it receives arrives: the shard hears nothing from it
    cut_at, healed_at = cut_and_heal(net, "learner1", "out", 8.0)
    assert noticed_within(c, 1, cut_at) <= FAILURE + SLACK
    assert longest_gap([e["t"] for e in c.merges(0)], cut_at, healed_at) <= STALL_BOUND
    c.wait_merged(1, after=healed_at)
    # the other way: the shard hears learner 1's heartbeats, but nothing it sends arrives
    cut_at, healed_at = cut_and_heal(net, "learner1", "in", 8.0)
    assert noticed_within(c, 1, cut_at) <= FAILURE + SLACK
    assert longest_gap([e["t"] for e in c.merges(0)], cut_at, healed_at) <= STALL_BOUND
    c.wait_merged(1, after=healed_at)
    check_books(c, c.finish())
    counters = net.counters("learner1")
    assert counters["sent_dropped"] > 0 and counters["received_dropped"] > 0


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_a_shard_cut_off_from_every_learner(make_network, tmp_path, shakespeare):
    net = make_network(names(2, 2), LINK)
    c = Cluster(net, tmp_path, shakespeare, shards=2, duration=45)
    for s in (0, 1):  # both learners in session with both shards before the cut (one CI-equivalent run
        for m in (0, 1):  # cut shard 1 off before learner 0 had joined it: nothing there to notice)
            c.wait_merged(m, s)
    cut_at, healed_at = cut_and_heal(net, "sync1", "both", 10.0)
    for m in (0, 1):  # the cut-off shard lost every learner; shard 0 went on merging everyone's work
        assert noticed_within(c, m, cut_at, shard=1) <= FAILURE + SLACK
        assert longest_gap([e["t"] for e in c.merges(m, 0)], cut_at, healed_at) <= STALL_BOUND
    for m in (0, 1):
        c.wait_merged(m, 1, after=healed_at)
    check_books(c, c.finish())


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_a_flapping_link(make_network, tmp_path, shakespeare):
    net = make_network(names(2, 1), LINK)
    c = Cluster(net, tmp_path, shakespeare, duration=40)
    c.wait_merged(1)
    start = time.time()
    flapper = net.flap("learner1", period=3.0, count=5)  # 1.5 s up, 1.5 s down, 5 times
    assert flapper.join(60)
    flapper.stop()
    end = time.time()
    assert flapper.cuts == 5
    assert longest_gap([e["t"] for e in c.merges(0)], start, end) <= STALL_BOUND
    c.wait_merged(1, after=end)
    check_books(c, c.finish())
