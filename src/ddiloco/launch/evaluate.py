"""Evaluating the global model of a run: from the shards' checkpoints at the end, over the network
(Fetch, read-only) during the run."""

from __future__ import annotations

from pathlib import Path

import grpc
import torch

from ..synchronizer.checkpoint import load_global_params
from ..train.tasks import Task
from ..wire import framing, rpc


def evaluate_params(task: Task, seed: int, params: dict[str, torch.Tensor], max_batches: int) -> dict[str, float]:
    model = task.build_model(seed)
    named = dict(model.named_parameters())
    missing = set(named) - set(params)
    if missing:
        raise ValueError(f"the global parameters lack {sorted(missing)[:3]}")
    with torch.no_grad():
        for name, p in named.items():
            p.copy_(params[name])
    return task.evaluate(model, max_batches=max_batches)


def evaluate_checkpoints(task: Task, seed: int, sync_dirs: list[Path], max_batches: int) -> dict[str, float]:
    params, _ = load_global_params(sync_dirs)
    return evaluate_params(task, seed, params, max_batches)


def fetch_params(addresses: list[str], token: str | None, timeout: float = 30.0) -> dict[str, torch.Tensor] | None:
    """The current global parameters from every shard, or None if a shard does not answer."""
    params: dict[str, torch.Tensor] = {}
    for address in addresses:
        channel = rpc.open_channel(address, "bulk", framing.DEFAULT_CHUNK_BYTES + rpc.FRAME_MARGIN)
        try:
            stubs = rpc.Stubs(channel, token)
            stream = stubs.fetch(framing.message({}), timeout=timeout, metadata=stubs.metadata)
            for msg in framing.read_stream(stream, 1 << 40):
                params.update(msg.tensors())
        except grpc.RpcError:
            return None
        finally:
            channel.close()
    return params
