"""Contributions arrive into buffers the synchronizer uses again (`wire.buffers`), over real gRPC."""

import time

import pytest
import torch

from ddiloco.core import AlgorithmConfig
from ddiloco.synchronizer.server import SynchronizerServer, build_service
from ddiloco.synchronizer.settings import ServiceSettings
from ddiloco.wire import framing, rpc

from ..support.heads import contribution_head
from ..support.runtime import FAST

pytestmark = pytest.mark.timeout(120)


def test_each_push_reuses_the_buffer_of_the_contribution_summed_before_it():
    """Pushes of a fragment big enough to pool (2 MB in bf16) after one another: the first allocates,
    every later one arrives into the memory the summed one left, and the merge is still exact."""
    numel = 1 << 20
    params = {"w": torch.zeros(numel)}
    algorithm = AlgorithmConfig(
        fragments=1, sync_every=4, overlap=1, quorum=2, grace=0.0, outer_lr=1.0, outer_momentum=0.0, merge="mean"
    )
    service = build_service(params, algorithm, ServiceSettings(timeouts=FAST, max_learners=2))
    server = SynchronizerServer(service, "127.0.0.1", 0)
    address = server.start()
    try:
        bulk = rpc.Stubs(rpc.open_channel(address, "bulk", rpc.FRAME_MARGIN + framing.DEFAULT_CHUNK_BYTES), None)
        sessions = [service.membership.register(m, f"inc{m}", True)["session"] for m in range(2)]
        for version in range(3):
            for m in range(2):
                head = contribution_head(sessions[m], version)
                grad = {"w": torch.full((numel,), -0.25 * (m + 1))}  # exact in bf16
                reply = framing.read_message(bulk.push(iter(framing.tensor_frames(head, grad, "bf16")), timeout=30))
                assert reply.get("ok"), reply
            deadline = time.monotonic() + 30
            while service.core.versions[0] != version + 1:
                assert time.monotonic() < deadline, "the round did not merge"
                time.sleep(0.01)
        pool = server.handlers.push_buffers
        assert pool.allocated == 1 and pool.reused == 5
        with service.lock:
            assert torch.equal(service.core.params["w"], torch.full((numel,), 3 * 0.375))  # -lr * mean, 3 times
    finally:
        server.stop(grace=0.2)
