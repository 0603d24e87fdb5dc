"""A learner that is itself a torch.distributed job: rank 0 talks to the synchronizer, every rank
applies the same updates at the same step.

After each step rank 0 broadcasts a small float tensor (which fragments changed, whether to stop,
the run's progress for the learning-rate schedule), then the changed fragments' parameters. Between
learners nothing collective is ever used; inside one learner these are ordinary broadcasts over its
own process group (gloo or NCCL). Plans travel as JSON bytes in a uint8 tensor, never pickled.
"""

from __future__ import annotations

from typing import Sequence

import torch
import torch.distributed as dist


def active_group_size(group=None) -> int:
    return dist.get_world_size(group) if dist.is_available() and dist.is_initialized() else 1


class RankFanout:
    def __init__(self, group=None) -> None:
        self.group = group
        self.rank = dist.get_rank(group)
        self.world = dist.get_world_size(group)
        self.src = dist.get_global_rank(group, 0) if group is not None else 0
        backend = dist.get_backend(group)
        self.device = torch.device("cuda", torch.cuda.current_device()) if backend == "nccl" else torch.device("cpu")

    @property
    def is_leader(self) -> bool:
        return self.rank == 0

    def share_bytes(self, data: bytes | None) -> bytes:
        size = torch.tensor([len(data) if data is not None else 0], dtype=torch.int64, device=self.device)
        dist.broadcast(size, self.src, group=self.group)
        buf = torch.zeros(int(size.item()), dtype=torch.uint8, device=self.device)
        if self.is_leader and data:
            buf.copy_(torch.frombuffer(bytearray(data), dtype=torch.uint8))
        dist.broadcast(buf, self.src, group=self.group)
        return bytes(buf.cpu().numpy().tobytes())

    def share_params(self, tensors: Sequence[torch.Tensor]) -> None:
        with torch.no_grad():
            for t in tensors:
                if t.device == self.device:
                    dist.broadcast(t.data, self.src, group=self.group)
                else:
                    tmp = t.data.to(self.device)
                    dist.broadcast(tmp, self.src, group=self.group)
                    t.data.copy_(tmp)

    def share_step(self, changed: Sequence[bool], stop: bool, progress: float, num_fragments: int) -> tuple[list[bool], bool, float]:
        flags = torch.zeros(num_fragments + 2, dtype=torch.float64, device=self.device)
        if self.is_leader:
            flags[:num_fragments] = torch.tensor([1.0 if c else 0.0 for c in changed], dtype=torch.float64)
            flags[num_fragments] = 1.0 if stop else 0.0
            flags[num_fragments + 1] = progress
        dist.broadcast(flags, self.src, group=self.group)
        values = flags.cpu().tolist()
        return [v > 0.5 for v in values[:num_fragments]], values[num_fragments] > 0.5, values[num_fragments + 1]
