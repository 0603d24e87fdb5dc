"""A learner for the FSDP test: a small byte-level model on tinyshakespeare, trained for a fixed
number of steps through `LearnerClient`. Under torchrun (2 ranks, gloo) the model is sharded with
FSDP2's `fully_shard` and each rank trains on its half of every batch; as one plain process it trains
on the whole batch. Either way the same inner steps happen, so a test can compare the two runs'
global models. Rank 0 writes the global model it fetches at the end to OUT (safetensors).

Usage: [torchrun --nproc-per-node 2] fsdp_learner.py ADDRESS DATA STEPS OUT"""

from __future__ import annotations

import os
import sys

import numpy as np
import torch
import torch.distributed as dist
from safetensors.torch import save_file

import ddiloco
from ddiloco.wire.timeouts import Timeouts

BATCH, SEQ = 8, 32


def model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(
        torch.nn.Embedding(256, 32),
        torch.nn.Linear(32, 64),
        torch.nn.GELU(),
        torch.nn.Linear(64, 64),
        torch.nn.GELU(),
        torch.nn.Linear(64, 256),
    )


def sharded_model() -> tuple[torch.nn.Module, int, int]:
    """(model, rank, world): sharded with FSDP2 over a gloo group under torchrun, whole otherwise."""
    torch.set_num_threads(1)
    world = int(os.environ.get("WORLD_SIZE", "1"))
    rank = 0
    net = model()
    if world > 1:
        from torch.distributed.fsdp import fully_shard

        dist.init_process_group("gloo")
        rank = dist.get_rank()
        for layer in net:
            if isinstance(layer, torch.nn.Linear):
                fully_shard(layer)
        fully_shard(net)
    return net, rank, world


def main(address: str, data: str, steps: int, out: str, attach: bool = False) -> None:
    """`attach`: the step boundary comes from `client.attach`'s optimizer hook, not `client.step`."""
    net, rank, world = sharded_model()
    optimizer = torch.optim.AdamW(net.parameters(), lr=3e-3)
    text = np.frombuffer(open(data, "rb").read(), dtype=np.uint8)
    # fp32 up: bf16 rounding would turn float-order noise between the runs into ulp-sized differences
    client = ddiloco.LearnerClient(net, address, 0, codec="fp32", timeouts=Timeouts.derive(0.2))
    client.start()
    per_rank = BATCH // world
    if attach:
        client.attach(optimizer, tokens_per_step=per_rank * SEQ)
    for step in range(steps):
        rng = np.random.default_rng(step)
        starts = rng.integers(0, len(text) - SEQ - 1, BATCH)[rank * per_rank : (rank + 1) * per_rank]
        window = torch.from_numpy(np.stack([text[s : s + SEQ + 1] for s in starts]).astype(np.int64))
        logits = net(window[:, :-1])
        loss = torch.nn.functional.cross_entropy(logits.reshape(-1, 256), window[:, 1:].reshape(-1))
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        if not attach:
            client.step(tokens=per_rank * SEQ, loss=loss.item())
    stats = client.finish()
    if rank == 0:
        save_file(ddiloco.fetch_global(address), out)
        print("stats", stats["accepted"], stats["rejected"], flush=True)
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
    main(sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4], attach=sys.argv[5:] == ["attach"])
