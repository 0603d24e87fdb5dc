"""Merges computed off the service lock, and heartbeats that never wait for it (real gRPC on loopback)."""

import dataclasses
import itertools
import threading

import pytest
import torch

from ddiloco.core import AlgorithmConfig, Contribution
from ddiloco.core.merge_job import MergeJob
from ddiloco.synchronizer.ledger import PendingWork
from ddiloco.wire import framing, rpc

from ..support.runtime import synchronizer, wait_for

pytestmark = pytest.mark.timeout(120)

SNAPSHOTS = itertools.count(4)  # each push a new snapshot (a learner's step count only grows)
ALGORITHM = AlgorithmConfig(fragments=1, sync_every=4, overlap=1, quorum=2, grace=0.0)


def push(service, session, learner, version=0):
    grads = {n: torch.full(service.shapes[n], 1e-3) for n in service.core.plan.names[0]}
    c = Contribution(learner, 0, version, grads, steps=4, tokens=256, seconds=1.0, step_time=0.25, step=next(SNAPSHOTS))
    return service.contribute(session, c, PendingWork(4, f"inc{learner}", 0.0, 1.0), None)


def test_a_heartbeat_is_answered_while_the_service_lock_is_held_and_its_tokens_booked_later(tiny_task, tmp_path):
    with synchronizer(tiny_task, tmp_path, algorithm=ALGORITHM, max_learners=2) as (service, address):
        session = service.membership.register(0, "inc0", True)["session"]
        control = rpc.Stubs(rpc.open_channel(address, "control", 1 << 20), None)
        with service.cond:  # the service is busy (a long merge, a checkpoint snapshot)
            reply = framing.read_message(
                control.call("Heartbeat", framing.message({"session": session, "tokens": 4096, "step": 3}), 10)
            )
            assert reply["ok"] is True  # answered without the lock
            assert service.ledger.tokens_reported == 0  # not booked while the lock was held
        wait_for(lambda: service.ledger.tokens_reported == 4096, 10, message="the tick to book the tokens")
        assert service.sessions.get(session).progress["step"] == 3


@pytest.mark.parametrize("late", ["refuse", "merge"])
def test_the_merge_runs_off_the_lock_and_work_against_the_version_being_merged_waits_or_is_refused(
    tiny_task, tmp_path, monkeypatch, late
):
    computing, release = threading.Event(), threading.Event()
    compute = MergeJob.compute

    def slow_compute(job):
        computing.set()
        assert release.wait(30)
        return compute(job)

    monkeypatch.setattr(MergeJob, "compute", slow_compute)
    algorithm = dataclasses.replace(ALGORITHM, late=late)
    with synchronizer(tiny_task, tmp_path, algorithm=algorithm, max_learners=3) as (service, _):
        sessions = [
            service.membership.session(service.membership.register(m, f"inc{m}", True)["session"]) for m in range(3)
        ]
        assert push(service, sessions[0], 0) == {"ok": True}
        assert push(service, sessions[1], 1) == {"ok": True}  # K = 2: the round closes, its merge is due
        assert computing.wait(10)
        assert service.lock.acquire(timeout=5)  # the lock is free while the merge computes
        service.lock.release()
        reply = push(service, sessions[2], 2)
        if late == "refuse":
            assert reply["ok"] is False and "being merged" in reply["reason"] and reply["code"] == "stale"
        else:  # kept for the fragment's next round (here none comes: it merges alone after H steps)
            assert reply == {"ok": True} and [w.staleness for w in service.core.carries[0].work] == [1]
        assert service.core.versions[0] == 0 and service.status()["merges"] == 0
        release.set()
        merges = 1 if late == "refuse" else 2
        wait_for(lambda: service.core.versions[0] == merges, 30, message="the merges to be applied")
        status = service.status()
    assert status["merges"] == merges and status["contributions"] == merges + 1
