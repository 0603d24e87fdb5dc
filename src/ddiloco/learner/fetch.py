"""The current global model, read-only, over the network (the synchronizer's `Fetch`): for a learner's
own evaluation, `ddiloco run`'s metrics, and `ddiloco.fetch_global`."""

from __future__ import annotations

import grpc
import torch

from ..wire import framing, reassembly, rpc


def fetch_params(addresses: list[str], token: str | None, timeout: float = 30.0) -> dict[str, torch.Tensor] | None:
    """The current global parameters from every shard, or None if a shard does not answer."""
    params: dict[str, torch.Tensor] = {}
    for address in addresses:
        channel = rpc.open_channel(address, "bulk", framing.DEFAULT_CHUNK_BYTES + rpc.FRAME_MARGIN)
        try:
            stubs = rpc.Stubs(channel, token)
            stream = stubs.fetch(framing.message({}), timeout=timeout, metadata=stubs.metadata)
            for msg in reassembly.read_stream(stream, 1 << 40):
                params.update(msg.tensors())
        except grpc.RpcError:
            return None
        finally:
            channel.close()
    return params
