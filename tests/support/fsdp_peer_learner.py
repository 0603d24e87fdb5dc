"""A learner for the FSDP peer-recovery test: the FSDP test's model on tinyshakespeare, an inner AdamW
handed to `LearnerClient` (so it takes a peer's state when it starts empty, and donates its own),
training until the run stops or the file OUT.stop appears. Under torchrun (gloo) the model is
sharded with FSDP2. Rank 0 writes OUT (JSON): what peer recovery brought, the checksum of the whole
inner state right after start() (gathered over the ranks), and its stats.

Usage: [torchrun --nproc-per-node 2] fsdp_peer_learner.py ADDRESS DATA ID OUT"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist

sys.path.insert(0, str(Path(__file__).resolve().parent))
from fsdp_learner import sharded_model  # noqa: E402

import ddiloco  # noqa: E402
from ddiloco.learner import peerstate  # noqa: E402
from ddiloco.wire.protocol import state_checksum  # noqa: E402
from ddiloco.wire.timeouts import Timeouts  # noqa: E402

BATCH, SEQ, MAX_STEPS, STEP_SECONDS = 4, 32, 5000, 0.04


def main(address: str, data: str, learner: int, out: str) -> None:
    ddiloco.log_to_stderr()
    net, rank, world = sharded_model()
    optimizer = torch.optim.AdamW(net.parameters(), lr=3e-3)
    text = np.frombuffer(open(data, "rb").read(), dtype=np.uint8)
    client = ddiloco.LearnerClient(
        net, address, learner, codec="fp32", timeouts=Timeouts.derive(0.2), optimizer=optimizer
    )
    client.start()
    after_start = state_checksum(*peerstate.snapshot(optimizer, dict(net.named_parameters())))  # collective
    stop_file = Path(out + ".stop")
    rng = np.random.default_rng(1000 * learner + rank)
    for _ in range(MAX_STEPS):
        began = time.perf_counter()
        starts = rng.integers(0, len(text) - SEQ - 1, BATCH)
        window = torch.from_numpy(np.stack([text[s : s + SEQ + 1] for s in starts]).astype(np.int64))
        loss = torch.nn.functional.cross_entropy(net(window[:, :-1]).reshape(-1, 256), window[:, 1:].reshape(-1))
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        time.sleep(max(0.0, STEP_SECONDS - (time.perf_counter() - began)))
        client.step(tokens=BATCH * SEQ, loss=loss.item())
        leave = torch.tensor([1.0 if stop_file.exists() else 0.0])
        if world > 1:
            dist.all_reduce(leave)
        if client.stopping or leave.item() > 0:
            break
    stats = client.finish()
    if rank == 0:
        Path(out).write_text(
            json.dumps(
                {
                    "recovered": client.recovered,
                    "after_start": after_start,
                    "world": world,
                    "accepted": stats["accepted"],
                    "rejected": stats["rejected"],
                    "donations": client.donations,
                }
            )
        )
    if world > 1:  # together: a rank that tears gloo down while the other still works can abort both
        dist.barrier()
        dist.destroy_process_group()
        # The work is done and checked above. Skip the interpreter's teardown: under load a rank
        # sometimes aborts in torch's C++ destructors at exit ("terminate called without an active
        # exception", the rank with no network links too; seen before the bulk socket plane as well).
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(0)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4])
