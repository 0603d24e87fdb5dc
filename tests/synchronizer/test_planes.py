"""The control plane (heartbeats, status) is never stuck behind bulk tensor traffic."""

import threading
import time

import grpc
import pytest
import torch

from ddiloco.wire import framing
from ddiloco.wire.protocol import signature
from ddiloco.wire.timeouts import Timeouts

from ..support.runtime import RawClient, synchronizer

pytestmark = pytest.mark.timeout(60)


def test_heartbeats_and_status_answer_while_a_large_push_is_held_open(tiny_task, tmp_path):
    # failure timeout 6 s: the held pushes must outlast the control calls below, not be cut off as idle
    with synchronizer(tiny_task, tmp_path, workers=10, reserved_control_workers=4, timeouts=Timeouts.derive(1.0)) as (
        service,
        address,
    ):
        raw = RawClient(address)
        reply = raw.register(0, signature(dict(tiny_task.build_model(0).named_parameters())))
        names = reply["plan"]["names"][0]
        shapes = reply["plan"]["shapes"]
        release = threading.Event()
        done = []

        def slow_frames(session):
            frames = raw.contribution(session, 0, {n: torch.zeros(tuple(shapes[n])) for n in names})
            frames = framing.frames(
                framing.unpack_frame(frames[0])[0]["head"],
                [b"".join(framing.unpack_frame(f)[1] for f in frames)],
                chunk_size=256,
            )  # many small chunks
            yield frames[0]
            release.wait(20)  # the bulk stream stays open until the control calls below are through
            yield from frames[1:]

        refused = []

        def push(client, session):
            try:
                done.append(client.push_frames(slow_frames(session), timeout=30))
            except grpc.RpcError as exc:
                refused.append(exc.code())

        # more bulk streams than the bulk slots, one learner each (a session may hold only two pushes)
        bulk_clients = [RawClient(address) for _ in range(8)]
        sessions = [
            c.register(m, signature(dict(tiny_task.build_model(0).named_parameters())))["session"]
            for m, c in enumerate(bulk_clients, start=1)
        ]
        pushers = [threading.Thread(target=push, args=(c, sid)) for c, sid in zip(bulk_clients, sessions, strict=True)]
        for t in pushers:
            t.start()
        time.sleep(0.3)
        answers = [raw.call("Heartbeat", {"session": reply["session"]}) for _ in range(5)]
        answers.append(raw.call("Status", {}))
        assert not done, "the pushes were meant to be still in flight"
        # 10 workers, 4 kept for the control plane: 6 bulk streams are served, 2 refused at once
        assert refused == [grpc.StatusCode.RESOURCE_EXHAUSTED] * 2
        release.set()
        for t in pushers:
            t.join(30)
        assert all(a.get("ok", True) for a in answers[:-1]) and "merges" in answers[-1]
        for c in [raw, *bulk_clients]:
            c.close()
