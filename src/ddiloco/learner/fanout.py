"""A learner that is itself a torch.distributed job: rank 0 talks to the synchronizer, every rank
applies the same updates at the same step.

At each step boundary rank 0 broadcasts a small float tensor (which fragments it applied, which it
is about to snapshot, whether to stop, the run's progress for the learning-rate schedule). Then:

* replicated parameters (DDP, or none of torch's wrappers): rank 0's copy is the model's; applied
  fragments are broadcast to the other ranks, snapshots need nothing.
* sharded parameters (FSDP2 `fully_shard`, any 1-D `DTensor`): rank 0 keeps a full fp32 host copy
  of them (the "mirror") for the algorithm. Applied fragments go out with `distribute_tensor` (each
  rank keeps its own shard); fragments about to be snapshotted are all-gathered (`full_tensor`) into
  the mirror first. The synchronizer always receives whole fragments. Cost on rank 0's host: the
  mirror plus the base copy, twice the model in fp32; on every rank, one full tensor at a time.

Between learners nothing collective is ever used; inside one learner these are ordinary collectives
over its own process group (gloo or NCCL). Plans travel as JSON bytes in a uint8 tensor, never pickled.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import cast

import torch
import torch.distributed as dist

try:
    from torch.distributed.tensor import DTensor, distribute_tensor
except ImportError:  # a torch built without distributed
    DTensor, distribute_tensor = (), None  # type: ignore[misc, assignment]  # no DTensor: isinstance is false, never called


def active_group_size(group=None) -> int:
    return dist.get_world_size(group) if dist.is_available() and dist.is_initialized() else 1


def is_sharded(t: torch.Tensor) -> bool:
    return bool(DTensor) and isinstance(t, DTensor)


class RankFanout:
    def __init__(self, params: Mapping[str, torch.Tensor], group=None) -> None:
        self.group = group
        self.rank = dist.get_rank(group)
        self.world = dist.get_world_size(group)
        self.src = dist.get_global_rank(group, 0) if group is not None else 0
        backend = dist.get_backend(group)
        self.device = torch.device("cuda", torch.cuda.current_device()) if backend == "nccl" else torch.device("cpu")
        self.params = dict(params)
        self.sharded = {n for n, p in self.params.items() if is_sharded(p)}
        for name in self.sharded:
            mesh = cast(DTensor, self.params[name]).device_mesh  # a sharded name's parameter is a DTensor
            if mesh.ndim != 1 or mesh.size() != self.world:
                raise NotImplementedError(
                    f"parameter {name!r} is sharded over a {mesh.ndim}-D mesh of {mesh.size()} ranks; a learner "
                    f"supports one 1-D mesh over all of its {self.world} ranks (HSDP is not supported yet)"
                )
        # rank 0's full fp32 host copy of the sharded parameters: what the algorithm reads and writes
        self.mirror = (
            {n: torch.zeros(self.params[n].shape, dtype=torch.float32) for n in sorted(self.sharded)}
            if self.is_leader
            else {}
        )

    @property
    def is_leader(self) -> bool:
        return self.rank == 0

    def algorithm_params(self) -> dict[str, torch.Tensor]:
        """What rank 0's algorithm holds: the mirror for sharded parameters, the model's own otherwise."""
        return {n: self.mirror.get(n, p) for n, p in self.params.items()}

    def share_bytes(self, data: bytes | None) -> bytes:
        size = torch.tensor([len(data) if data is not None else 0], dtype=torch.int64, device=self.device)
        dist.broadcast(size, self.src, group=self.group)
        buf = torch.zeros(int(size.item()), dtype=torch.uint8, device=self.device)
        if self.is_leader and data:
            buf.copy_(torch.frombuffer(bytearray(data), dtype=torch.uint8))
        dist.broadcast(buf, self.src, group=self.group)
        return bytes(buf.cpu().numpy().tobytes())

    def push(self, names: Sequence[str]) -> None:
        """Rank 0's values of these parameters onto every rank (each sharded rank keeps its shard)."""
        with torch.no_grad():
            for name in names:
                p = self.params[name]
                if name in self.sharded:
                    self._push_sharded(name, cast(DTensor, p))
                elif p.device == self.device:
                    dist.broadcast(p.data, self.src, group=self.group)
                else:
                    tmp = p.data.to(self.device)
                    dist.broadcast(tmp, self.src, group=self.group)
                    p.data.copy_(tmp)

    def _push_sharded(self, name: str, p: DTensor) -> None:
        mesh = p.device_mesh
        if self.is_leader:
            full = self.mirror[name].to(mesh.device_type, p.dtype)
        else:
            full = torch.empty(p.shape, dtype=p.dtype, device=mesh.device_type)
        mine = distribute_tensor(full, mesh, p.placements, src_data_rank=0)
        p.to_local().copy_(mine.to_local())

    def scatter(self, name: str, full: torch.Tensor) -> torch.Tensor:
        """Rank 0's full fp32 `full` as a DTensor laid out like sharded parameter `name`: each rank gets
        its own shard (for optimizer state such as AdamW's moments)."""
        p = cast(DTensor, self.params[name])  # `name` is sharded
        mesh = p.device_mesh
        full = (
            full.to(mesh.device_type, torch.float32)
            if self.is_leader
            else torch.empty(p.shape, dtype=torch.float32, device=mesh.device_type)
        )
        return distribute_tensor(full, mesh, p.placements, src_data_rank=0)

    def broadcast(self, t: torch.Tensor) -> torch.Tensor:
        """Rank 0's `t` on every rank (in place on rank 0's device copy); returns it on the CPU."""
        buf = t.to(self.device)
        dist.broadcast(buf, self.src, group=self.group)
        return buf.cpu()

    def pull(self, names: Sequence[str]) -> None:
        """The current values of these sharded parameters into rank 0's mirror (replicated: nothing)."""
        with torch.no_grad():
            for name in names:
                if name in self.sharded:
                    full = cast(DTensor, self.params[name].detach()).full_tensor()
                    if self.is_leader:
                        self.mirror[name].copy_(full)

    def share_step(
        self,
        applied: Sequence[int],
        due: Sequence[int],
        stop: bool,
        progress: float,
        num_fragments: int,
        donate: bool = False,
    ) -> tuple[list[int], list[int], bool, float, bool]:
        """Rank 0's view of this boundary on every rank: applied and due fragments, stop, progress, and
        whether to gather the inner state for a donation."""
        n = num_fragments
        flags = torch.zeros(2 * n + 3, dtype=torch.float64, device=self.device)
        if self.is_leader:
            values = [0.0] * (2 * n + 3)
            for p in applied:
                values[p] = 1.0
            for p in due:
                values[n + p] = 1.0
            values[2 * n], values[2 * n + 1] = (1.0 if stop else 0.0), float(progress)
            values[2 * n + 2] = 1.0 if donate else 0.0
            flags.copy_(torch.tensor(values, dtype=torch.float64))
        dist.broadcast(flags, self.src, group=self.group)
        v = flags.cpu().tolist()
        return (
            [p for p in range(n) if v[p] > 0.5],
            [p for p in range(n) if v[n + p] > 0.5],
            v[2 * n] > 0.5,
            v[2 * n + 1],
            v[2 * n + 2] > 0.5,
        )
