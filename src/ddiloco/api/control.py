"""Ending a run from anywhere: `ddiloco stop ADDRESS` and `ddiloco.stop_run`, over the same
authenticated control channel the learners use (the synchronizer's `Stop`)."""

from __future__ import annotations

from collections.abc import Sequence

import grpc

from ..wire import framing, rpc


def stop_run(
    addresses: str | Sequence[str], token: str | None = None, reason: str = "stop requested", timeout: float = 10.0
) -> list[str]:
    """Ask every shard to end the run (learners send what they hold and leave); returns the shards
    that acknowledged. A shard that refuses or does not answer is a ConnectionError naming it."""
    shards = [a.strip() for a in addresses.split(",")] if isinstance(addresses, str) else list(addresses)
    done = []
    for address in shards:
        rpc.check_address(address)
        channel = rpc.open_channel(address, "control", framing.DEFAULT_CHUNK_BYTES + rpc.FRAME_MARGIN)
        try:
            stubs = rpc.Stubs(channel, token)
            framing.read_message(stubs.call("Stop", framing.message({"reason": reason[:200]}), timeout))
            done.append(address)
        except grpc.RpcError as exc:
            raise ConnectionError(
                f"synchronizer {address} did not stop the run ({exc.code().name}: {exc.details()})"
            ) from None
        finally:
            channel.close()
    return done


def shard_status(address: str, token: str | None = None, timeout: float = 5.0) -> dict:
    """One shard's status (versions, merges, learners, budget progress), as `Status` answers it."""
    rpc.check_address(address)
    channel = rpc.open_channel(address, "control", framing.DEFAULT_CHUNK_BYTES + rpc.FRAME_MARGIN)
    try:
        return framing.read_message(rpc.Stubs(channel, token).call("Status", framing.message({}), timeout))
    except grpc.RpcError as exc:
        raise ConnectionError(f"synchronizer {address} did not answer Status ({exc.code().name})") from None
    finally:
        channel.close()
