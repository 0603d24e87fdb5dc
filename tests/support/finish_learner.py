"""A learner of two ranks (gloo) that calls `finish()` while a contribution of rank 0 is still
waiting for its merge. The value of that merge arrives while rank 0 waits inside finish(); every
rank must end with it. Replicated (each rank a whole copy) or sharded with FSDP2 (`fsdp`). Each rank
writes the digest of its full parameters and rank 0's versions before and after finish() to OUT-RANK.json.

Usage: torchrun --nproc-per-node 2 finish_learner.py ADDRESS DATA OUT [fsdp]"""

from __future__ import annotations

import hashlib
import json
import os
import sys
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist

sys.path.insert(0, str(Path(__file__).resolve().parent))
from fsdp_learner import BATCH, SEQ, model  # noqa: E402

import ddiloco  # noqa: E402

MAX_STEPS = 200


def full_digest(net: torch.nn.Module) -> str:
    """The digest of the whole model (sharded parameters gathered: collective)."""
    h = hashlib.sha256()
    for name, p in sorted(net.named_parameters()):
        t = p.detach()
        t = t.full_tensor() if hasattr(t, "full_tensor") else t
        h.update(name.encode() + t.float().contiguous().numpy().tobytes())
    return h.hexdigest()


def main(address: str, data: str, out: str, sharded: bool) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    net = model()
    if sharded:
        from torch.distributed.fsdp import fully_shard

        fully_shard(net)
    optimizer = torch.optim.AdamW(net.parameters(), lr=3e-3)
    text = np.frombuffer(open(data, "rb").read(), dtype=np.uint8)
    client = ddiloco.LearnerClient(net, address, 0)
    client.start()
    per_rank = BATCH // world
    for step in range(MAX_STEPS):
        rng = np.random.default_rng(step)
        starts = rng.integers(0, len(text) - SEQ - 1, BATCH)[rank * per_rank : (rank + 1) * per_rank]
        window = torch.from_numpy(np.stack([text[s : s + SEQ + 1] for s in starts]).astype(np.int64))
        loss = torch.nn.functional.cross_entropy(net(window[:, :-1]).reshape(-1, 256), window[:, 1:].reshape(-1))
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        client.step(tokens=per_rank * SEQ)
        # leave at the first boundary where rank 0 has a contribution on its way (decided together)
        waiting = torch.tensor([rank == 0 and step >= 8 and client.core.pending[0] is not None], dtype=torch.int32)
        dist.broadcast(waiting, 0)
        if waiting.item():
            break
    before = list(client.core.versions) if rank == 0 else []
    client.finish(timeout=60)
    after = list(client.core.versions) if rank == 0 else []
    record = {"rank": rank, "digest": full_digest(net), "before": before, "after": after, "steps": step + 1}
    with open(f"{out}-{rank}.json", "w") as f:
        json.dump(record, f)
    dist.barrier()
    dist.destroy_process_group()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)  # as fsdp_learner.py: skip torch's C++ teardown, which can abort a rank under load


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4:] == ["fsdp"])
