"""The state every rank of a generation holds alike, and how a new generation makes it so.

The model's lineage (`Lineage`) counts what the model holds: every all-reduced step, its tokens and
seconds, and where each data shard's stream stands. It changes only at a step's commit, on every
rank at once, together with the parameters, so whatever rank 0 of the next generation holds is
consistent with itself; that rank's copy (parameters through DDP, the optimizer's moments and the
lineage here) is broadcast to the others when a generation forms. A replacement therefore starts
from the survivors' state, not from an older checkpoint.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
import torch.distributed as dist

from ..train.optimizers import fill_state

SCALARS = ("step", "tokens_merged", "useful_seconds", "window_start", "last_commit", "covered_seconds", "longest_gap")


@dataclass
class Lineage:
    """Counters of the model's own history (float64 on the wire: exact for integers below 2**53)."""

    workers: int
    step: int = 0
    tokens_merged: int = 0
    useful_seconds: float = 0.0  # sum over merged steps of each participant's step seconds
    window_start: float = 0.0  # wall time the first generation formed
    last_commit: float = 0.0  # wall time of the newest merged step
    covered_seconds: float = 0.0  # wall time inside merged steps (steps never overlap)
    longest_gap: float = 0.0  # longest wall time between two merged steps (restarts included)
    positions: list[int] = field(default_factory=list)  # batches drawn from each slot's data shard

    def __post_init__(self) -> None:
        if not self.positions:
            self.positions = [0] * self.workers

    def commit(self, slots: list[int], tokens: int, seconds: float, started: float, now: float) -> None:
        """A step all of `slots` trained was all-reduced and applied."""
        self.step += 1
        self.tokens_merged += tokens
        self.useful_seconds += seconds
        self.covered_seconds += max(0.0, now - max(started, self.last_commit))
        self.longest_gap = max(self.longest_gap, now - (self.last_commit or self.window_start or now))
        self.last_commit = now
        for s in slots:
            self.positions[s] += 1

    def to_tensor(self, device: torch.device) -> torch.Tensor:
        values = [float(getattr(self, k)) for k in SCALARS] + [float(p) for p in self.positions]
        return torch.tensor(values, dtype=torch.float64, device=device)

    def load_tensor(self, t: torch.Tensor) -> None:
        values = t.tolist()
        for i, key in enumerate(SCALARS):
            setattr(self, key, int(values[i]) if key in ("step", "tokens_merged") else float(values[i]))
        self.positions = [int(v) for v in values[len(SCALARS) :]]

    def to_json(self) -> dict:
        return {**{k: getattr(self, k) for k in SCALARS}, "positions": list(self.positions)}

    @classmethod
    def from_json(cls, workers: int, data: dict) -> Lineage:
        positions = [int(p) for p in data.get("positions", [])]
        if len(positions) != workers:
            raise ValueError(f"the checkpoint is for {len(positions)} workers, this run has {workers}")
        lineage = cls(workers, positions=positions)
        for key in SCALARS:
            setattr(lineage, key, type(getattr(lineage, key))(data.get(key, 0)))
        return lineage


def ensure_optimizer_state(optimizer: torch.optim.Optimizer) -> None:
    """Give every parameter its optimizer's state (zeros, as its first step would: `train.optimizers.fill_state`),
    so that every rank has the same tensors to receive into, whether it has trained yet or not."""
    fill_state(optimizer)


def _state_tensors(optimizer: torch.optim.Optimizer) -> list[torch.Tensor]:
    out: list[torch.Tensor] = []
    for group in optimizer.param_groups:
        for p in group["params"]:
            state = optimizer.state[p]
            out.extend(state[k] for k in sorted(state) if isinstance(state[k], torch.Tensor))
    return out


def broadcast_state(optimizer: torch.optim.Optimizer, lineage: Lineage, device: torch.device) -> None:
    """Rank 0's optimizer moments and lineage to every rank (the parameters go with DDP's own
    broadcast when it wraps the model). One flat broadcast per dtype, not one per tensor."""
    ensure_optimizer_state(optimizer)
    counters = lineage.to_tensor(device)
    dist.broadcast(counters, src=0)
    lineage.load_tensor(counters.cpu())
    by_dtype: dict[tuple[torch.dtype, torch.device], list[torch.Tensor]] = {}
    for t in _state_tensors(optimizer):
        by_dtype.setdefault((t.dtype, t.device), []).append(t)
    for (dtype, where), tensors in by_dtype.items():
        flat = torch.cat([t.reshape(-1) for t in tensors]).to(device)
        dist.broadcast(flat, src=0)
        offset = 0
        for t in tensors:
            n = t.numel()
            t.copy_(flat[offset : offset + n].view_as(t).to(where, dtype))
            offset += n
