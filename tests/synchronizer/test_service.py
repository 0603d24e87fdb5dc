"""The synchronizer service and learner clients in one process, over real loopback gRPC."""

import contextlib
import itertools
import logging
import math
import time

import pytest

from ddiloco.records.events import read_events
from ddiloco.synchronizer.checkpoint import CheckpointStore

from ..support.runtime import LearnerThread, params_of, same, synchronizer, wait_for

pytestmark = pytest.mark.timeout(120)


@contextlib.contextmanager
def k1_sessions(tiny_task, tmp_path, learners: int = 2, late: str = "refuse", **settings):
    """A K = 1, no-grace synchronizer with `learners` registered sessions, and push(m): learner m's
    small outer gradient against version 0, contributed in this thread. Late work is refused (the
    paper's rule) unless `late` says "merge"."""
    import torch

    from ddiloco.core import AlgorithmConfig, Contribution
    from ddiloco.synchronizer.ledger import PendingWork

    algorithm = AlgorithmConfig(fragments=1, sync_every=4, overlap=1, quorum=1, grace=0.0, late=late)
    with synchronizer(tiny_task, tmp_path, algorithm=algorithm, max_learners=learners, **settings) as (service, _):
        sessions = [
            service.membership.session(service.membership.register(m, f"inc{m}", True)["session"])
            for m in range(learners)
        ]
        grads = {n: torch.full(service.shapes[n], 1e-3) for n in service.core.plan.names[0]}
        snapshots = itertools.count(4)  # each push a new snapshot (a learner's step count only grows)

        def push(m: int, final: bool = False) -> dict:
            c = Contribution(m, 0, 0, grads, steps=4, tokens=256, seconds=1.0, step_time=0.25, step=next(snapshots))
            return service.contribute(sessions[m], c, PendingWork(4, f"inc{m}", 0.0, 1.0, final), None)

        yield service, sessions, push


def test_two_learners_train_and_sync_until_the_budget(tiny_task, tmp_path):
    with synchronizer(tiny_task, tmp_path, tokens=2 * 40 * 64) as (service, address):
        initial = params_of(service)
        learners = [LearnerThread(tiny_task, address, m, step_delay=0.02) for m in range(2)]
        for t in learners:
            t.start()
        for t in learners:
            t.join(60)
            assert not t.is_alive() and t.error is None, t.error
        wait_for(lambda: service.finished.is_set(), 10, message="the run to drain")
        status = service.status()
    assert status["merges"] >= 4 and sum(status["versions"].values()) == status["merges"]
    assert not same(initial, params_of(service)), "the global model never moved"
    admitted = {
        a["learner"] for e in read_events(tmp_path / "events.jsonl") if e["kind"] == "merge" for a in e["admitted"]
    }
    assert admitted == {0, 1}
    assert status["double_merged_steps"] == 0
    trained = sum(t.result["tokens"] for t in learners)
    assert status["tokens_reported"] == trained
    assert 0 < status["tokens_merged"] <= trained
    for t in learners:  # each learner ends holding the versions it last received
        assert t.result["versions"] and max(t.result["versions"]) >= 1


def test_a_late_joiner_gets_the_current_global_model_and_never_drags_it_back(tiny_task, tmp_path):
    with synchronizer(tiny_task, tmp_path) as (service, address):
        first = LearnerThread(tiny_task, address, 0, step_delay=0.01)
        first.start()
        wait_for(lambda: service.status()["merges"] >= 4, 30, message="merges")
        first.halt.set()  # freeze the global model so the comparison below is exact
        first.join(30)
        assert first.error is None
        versions = dict(service.core.versions)
        global_now = params_of(service)
        late = LearnerThread(tiny_task, address, 1, steps=12, step_delay=0.01, seed=999)  # another init
        late.client.start()
        held = {n: p.detach().clone() for n, p in late.model.named_parameters()}
        assert late.client.core.versions == [versions[p] for p in sorted(versions)]
        assert same(held, {n: t.bfloat16().float() for n, t in global_now.items()})  # updates go down in bf16
        assert late.client.start_position == 0
        late.client.close()
        fresh = LearnerThread(tiny_task, address, 1, steps=12, step_delay=0.01, seed=999)
        fresh.start()
        fresh.join(30)
        assert fresh.error is None and fresh.result["accepted"] >= 1
        after = {int(p): v for p, v in service.status()["versions"].items()}
    assert all(after[p] >= versions[p] for p in versions) and after != versions


def test_checkpoint_restores_parameters_outer_state_versions_and_books(tiny_task, tmp_path):
    with synchronizer(tiny_task, tmp_path, tokens=2 * 30 * 64) as (service, address):
        learners = [LearnerThread(tiny_task, address, m, step_delay=0.01) for m in range(2)]
        for t in learners:
            t.start()
        for t in learners:
            t.join(60)
        wait_for(lambda: service.finished.is_set(), 10)
    # the server stopped: a final checkpoint was written
    before = service.status()
    with synchronizer(tiny_task, tmp_path) as (restored, _):
        assert restored.restored_from is not None
        assert restored.core.versions == service.core.versions
        assert same(params_of(restored), params_of(service))
        for p in service.core.owned:
            assert same(restored.core.outer[p].buffers, service.core.outer[p].buffers)
        after = restored.status()
        for key in ("merges", "tokens_merged", "tokens_reported", "contributions"):
            assert after[key] == pytest.approx(before[key])
    store = CheckpointStore(tmp_path / "ckpt")
    kept = sorted(p.name for p in store.frag_dir.iterdir())
    assert all(name.endswith(".safetensors") for name in kept)
    assert len(kept) <= 2 * len(service.core.owned)  # old versions are collected


def test_updates_wait_until_their_version_is_durable(tiny_task, tmp_path):
    with synchronizer(tiny_task, tmp_path, tokens=2 * 20 * 64) as (service, address):
        learners = [LearnerThread(tiny_task, address, m, step_delay=0.01) for m in range(2)]
        for t in learners:
            t.start()
        for t in learners:
            t.join(60)
    merges = [e for e in read_events(tmp_path / "events.jsonl") if e["kind"] == "merge"]
    checkpoints = [e for e in read_events(tmp_path / "events.jsonl") if e["kind"] == "checkpoint"]
    assert merges and checkpoints
    # every version a learner ever held was in a checkpoint written before the learner could see it
    durable = {}
    for e in checkpoints:
        for p, v in e["versions"].items():
            durable[int(p)] = max(durable.get(int(p), 0), v)
    for t in learners:
        for p, v in enumerate(t.result["versions"]):
            assert v <= durable[p]


@pytest.mark.parametrize("codec", ["int8", "int4"])
def test_quantised_outer_gradients_are_accepted_and_merged(tiny_task, tmp_path, codec):
    with synchronizer(tiny_task, tmp_path, tokens=2 * 20 * 64) as (service, address):
        learners = [LearnerThread(tiny_task, address, m, step_delay=0.01, codec=codec) for m in range(2)]
        for t in learners:
            t.start()
        for t in learners:
            t.join(60)
            assert t.error is None, t.error
    assert service.status()["merges"] > 0
    assert all(t.result["accepted"] > 0 for t in learners)
    assert service.status()["rejected_contributions"] == sum(t.result["rejected"] for t in learners)


def test_contributions_queued_behind_the_service_lock_join_a_k1_round_instead_of_going_stale(tiny_task, tmp_path):
    import threading

    with k1_sessions(tiny_task, tmp_path, learners=3) as (service, _, push):
        replies = {}
        threads = [threading.Thread(target=lambda m=m: replies.update({m: push(m)})) for m in range(3)]
        with service.cond:  # the service is busy: all three contributions arrive and queue behind it
            for t in threads:
                t.start()
            wait_for(lambda: service.arrivals._queued[0] == 3, 10, message="three queued contributions")
        for t in threads:
            t.join(10)
        wait_for(lambda: service.core.versions[0] == 1, 10, message="the merge (computed off the lock)")
        status = service.status()
    assert replies == {m: {"ok": True} for m in range(3)}
    assert status["merges"] == 1 and status["contributions"] == 3 and service.core.versions[0] == 1


def test_updates_tell_each_learner_whether_the_merge_took_its_work(tiny_task, tmp_path):
    """A late contribution is refused as stale; the update it gets says the merge took only the
    opener, which is what lets a re-basing learner keep the refused work (`FragmentUpdate.merged`)."""
    from ddiloco.learner.link import merged_learners
    from ddiloco.wire.reassembly import Reassembler

    with k1_sessions(tiny_task, tmp_path) as (service, sessions, push):

        def updates(m: int) -> list[dict]:
            heads, reassembler = [], Reassembler(1 << 30)
            while (frame := sessions[m].outbox.get(0.5)) is not None:
                msg = reassembler.feed(frame)
                if msg is not None and msg.head.get("kind") == "update":
                    heads.append(msg.head)
            return heads

        assert push(0) == {"ok": True}
        wait_for(lambda: service.core.versions[0] == 1, 10, message="the merge of learner 0's work")
        late = push(1)  # still against version 0
        assert "stale" in late.get("error", "") + late.get("reason", ""), late
        heads = {m: [h for h in updates(m) if h["version"] == 1] for m in range(2)}
    assert heads[0] and all(merged_learners(h.get("admitted")) == (0,) for h in heads[0] + heads[1])
    assert heads[1]  # the broadcast and the reply to its stale work: neither took learner 1's
    assert merged_learners([0, "x"]) is None and merged_learners(None) is None and merged_learners([True]) is None


def test_late_work_is_merged_once_in_a_later_round_and_booked_once(tiny_task, tmp_path):
    """With late work merged (the default) a push against a version already merged is accepted,
    goes into the fragment's next merge with its tokens, and the ledger books it once."""
    with k1_sessions(tiny_task, tmp_path, late="merge") as (service, sessions, push):
        assert push(0) == {"ok": True}
        wait_for(lambda: service.core.versions[0] == 1, 10, message="the merge of learner 0's work")
        assert push(1) == {"ok": True}  # against version 0: late, kept
        again = push(1)  # a later snapshot on the same version repeats the taken one (core/taken.py)
        assert again["ok"] is False and again["code"] == "duplicate" and "action" not in again
        # nobody else contributes: the carry merges alone after H steps at the step time (4 x 0.25 s)
        wait_for(lambda: service.core.versions[0] == 2, 30, message="the late work's merge")
        status = service.status()
        books = service.ledger.books
    assert status["merges"] == 2 and status["contributions"] == 2
    share = 1.0  # one fragment
    assert books[0].tokens_merged == books[1].tokens_merged == 256 * share
    assert service.ledger.double_merged_steps == 0


def test_a_finishing_learner_is_told_its_final_work_was_merged_without_the_values(tiny_task, tmp_path):
    """Final work (the learner is leaving) that a merge took is acknowledged by a notice of a few
    bytes; the others get the update in full, and so does final work the merge did not take."""
    from ddiloco.wire.reassembly import Reassembler
    from ddiloco.wire.timeouts import Timeouts

    # sessions that send no heartbeats: declared gone only after 6 s, however loaded the machine
    with k1_sessions(tiny_task, tmp_path, timeouts=Timeouts.derive(1.0)) as (service, sessions, push):

        def received(m: int) -> list[tuple[dict, int]]:
            got, reassembler = [], Reassembler(1 << 30)
            while (frame := sessions[m].outbox.get(0.5)) is not None:
                msg = reassembler.feed(frame)
                if msg is not None and msg.head.get("kind") in ("update", "merged"):
                    got.append((msg.head, len(frame)))
            return got

        assert push(0, final=True) == {"ok": True}
        wait_for(lambda: service.core.versions[0] == 1, 10, message="the merge of learner 0's final work")
        late = push(1, final=True)  # still against version 0: refused as stale, so not merged
        assert late["ok"] is False and "stale" in late["reason"], late
        got = {m: [(h, n) for h, n in received(m) if h["version"] == 1] for m in range(2)}
    [(notice, size)] = got[0]
    assert notice["kind"] == "merged" and notice["fragment"] == 0 and "tensors" not in notice
    assert notice["merged"] == {"0": 4} and size < 300
    full = sum(math.prod(service.shapes[n]) for n in service.core.plan.names[0]) * 2  # bf16 down
    assert got[1] and all(h["kind"] == "update" and h["tensors"] for h, _ in got[1])  # one queued update per version
    assert all(n > full for _, n in got[1])


def test_the_timer_does_not_merge_a_round_while_contributions_are_queued_for_it(tiny_task, tmp_path):
    import threading

    with k1_sessions(tiny_task, tmp_path) as (service, sessions, push):
        replies = {}
        late = threading.Thread(target=lambda: replies.update({1: push(1)}))
        with service.cond:  # learner 1's contribution arrives and queues behind the busy service
            late.start()
            wait_for(lambda: service.arrivals._queued[0] == 1, 10, message="one queued contribution")
            replies[0] = push(0)  # learner 0's enters first (the lock is re-entrant) and holds the round
            service._tick()  # the timer runs before learner 1's gets the lock
            assert service.core.versions[0] == 0
        late.join(10)
        wait_for(lambda: service.core.versions[0] == 1, 10, message="the merge (computed off the lock)")
    assert replies == {0: {"ok": True}, 1: {"ok": True}}
    assert service.core.versions[0] == 1


def test_learners_joining_together_share_one_encoding_of_each_fragment(tiny_task, tmp_path):
    """A rejoin wave after a restart must not hold one encoded copy of the model per learner."""
    with k1_sessions(tiny_task, tmp_path, learners=3) as (service, sessions, push):
        firsts = [s.outbox.get(1.0) for s in sessions]  # each learner's first frame: its join update
        assert firsts[0] is not None and all(f is firsts[0] for f in firsts)
        assert push(0) == {"ok": True}
        wait_for(lambda: service.core.versions[0] == 1, 10, message="a merge")
        with service.cond:
            service.dispatcher.forget_encoded(older_than=0.0)
            assert service.dispatcher._encoded == {}


def test_a_session_pushing_refused_work_in_a_loop_is_logged_rate_limited_and_counted_in_full(
    tiny_task, tmp_path, caplog
):
    # a token holder's session repeating refused work (#32): every refusal is counted and kept as an
    # event, but the log takes at most the burst (20) plus 5 a second
    with k1_sessions(tiny_task, tmp_path) as (service, sessions, push):
        assert push(0) == {"ok": True}
        wait_for(lambda: service.core.versions[0] == 1, 10, message="the merge of learner 0's work")
        started = time.monotonic()
        with caplog.at_level(logging.INFO, logger="ddiloco.synchronizer.service"):
            replies = [push(1) for _ in range(200)]  # each against version 0: stale, refused
        seconds = time.monotonic() - started
        status = service.status()
    assert all(r["ok"] is False for r in replies)
    logged = [r for r in caplog.records if "rejected contribution" in r.getMessage()]
    assert 1 <= len(logged) <= 20 + 5 * seconds + 1
    assert status["rejected_contributions"] >= 200
    assert sum(e["kind"] == "rejected" for e in read_events(tmp_path / "events.jsonl")) >= 200
