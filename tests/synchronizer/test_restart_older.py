"""A synchronizer that restarts from a checkpoint older than what learners hold (--checkpoint-every N):
learners are moved back to the restored versions and go on from there."""

import pytest

from ddiloco.synchronizer.server import SynchronizerServer, build_service
from ddiloco.synchronizer.settings import ServiceSettings

from ..support.runtime import ALGORITHM, FAST, LearnerThread, wait_for

pytestmark = pytest.mark.timeout(120)


def start(task, tmp_path, port=0):
    params = {n: p.detach() for n, p in task.build_model(0).named_parameters()}
    settings = ServiceSettings(timeouts=FAST, checkpoint_every=1000)  # only the initial checkpoint
    service = build_service(params, ALGORITHM, settings, task.embedding_names, checkpoint_dir=tmp_path / "ckpt")
    server = SynchronizerServer(service, "127.0.0.1", port)
    return service, server, server.start()


def test_learners_follow_a_synchronizer_that_lost_merges(tiny_task, tmp_path):
    service, server, address = start(tiny_task, tmp_path)
    learners = [LearnerThread(tiny_task, address, m, step_delay=0.01) for m in range(2)]
    for t in learners:
        t.start()
    wait_for(lambda: min(service.core.versions.values()) >= 4, 30, message="merges")
    server.server.stop(0).wait(5)  # a crash: no final checkpoint, the merges since the start are lost
    server.front.stop()  # and its port let go (gRPC listens behind it: `grpc_front`)
    service.commit.close()
    restored, server2, address2 = start(tiny_task, tmp_path, int(address.rsplit(":", 1)[1]))
    try:
        assert address2 == address and restored.core.versions == {0: 0, 1: 0}
        # learners held versions >= 4; they are moved back to the restored ones and train on from there
        wait_for(
            lambda: (
                all(t.client.core.versions[p] <= restored.core.versions[p] for t in learners for p in (0, 1))
                and min(restored.core.versions.values()) >= 2
            ),
            60,
            message="learners to resync and merge again",
        )
        for t in learners:
            t.halt.set()
        for t in learners:
            t.join(30)
            assert t.error is None, t.error
        assert restored.status()["double_merged_steps"] == 0
    finally:
        server2.stop(grace=0.2)
