"""gRPC plumbing: method names, the server, and the two channels a learner opens per shard.

gRPC over HTTP/2 gives us flow control, deadlines, keep-alive and TLS for free. We use generic
handlers with bytes in and bytes out (our own framing, see `wire`), so there is no protobuf codegen.

Control plane and bulk plane are separate TCP connections (each channel gets its own subchannel
pool): a heartbeat or a decline never queues behind a multi-megabyte tensor on the same socket. On
the server, bulk handlers are capped below the thread-pool size so that control RPCs always find a
free worker.
"""

from __future__ import annotations

from collections.abc import Callable
from concurrent import futures
from typing import Any, cast

import grpc

SERVICE = "ddiloco.Synchronizer"
CONTROL_METHODS = ("Register", "Heartbeat", "Decline", "Leave", "Status", "Stop", "Donor")
BULK_METHODS = ("Push", "Subscribe", "Fetch", "Donate", "Recover")
FRAME_MARGIN = 1 << 20  # header room on top of the chunk size


def check_address(address: str) -> None:
    """A synchronizer address must be host:port (or [ipv6]:port) with a port in 1..65535; checked
    up front, without resolving anything, so that a typo fails at once instead of after retries."""
    host, sep, port = address.rpartition(":")
    ok = bool(sep and host and port.isdigit() and 1 <= int(port) <= 65535 and not any(c.isspace() for c in address))
    if ok and host.startswith("["):
        ok = host.endswith("]") and len(host) > 2
    elif ok:
        ok = ":" not in host and "/" not in host
    if not ok:
        raise ValueError(
            f"bad synchronizer address {address[:80]!r}: expected host:port with a port in 1..65535 "
            "(for example 127.0.0.1:7070)"
        )


def path(method: str) -> str:
    return f"/{SERVICE}/{method}"


def _message_options(max_frame: int) -> list[tuple[str, int]]:
    return [("grpc.max_receive_message_length", max_frame), ("grpc.max_send_message_length", max_frame)]


def make_server(
    handlers: dict[str, Callable[..., Any]],
    max_frame: int,
    workers: int,
    interceptors: tuple[grpc.ServerInterceptor, ...] = (),
) -> grpc.Server:
    """A gRPC server serving `handlers` (method name -> callable) as our generic service."""
    kinds = {
        "Push": grpc.stream_unary_rpc_method_handler,
        "Subscribe": grpc.unary_stream_rpc_method_handler,
        "Fetch": grpc.unary_stream_rpc_method_handler,
        "Donate": grpc.stream_unary_rpc_method_handler,
        "Recover": grpc.unary_stream_rpc_method_handler,
    }
    method_handlers: dict[str, grpc.RpcMethodHandler[bytes, bytes]] = {
        name: kinds.get(name, grpc.unary_unary_rpc_method_handler)(fn) for name, fn in handlers.items()
    }
    options = _message_options(max_frame) + [
        ("grpc.so_reuseport", 0),  # a second synchronizer on the same port must fail, not share it
        ("grpc.keepalive_time_ms", 10_000),
        ("grpc.keepalive_permit_without_calls", 1),
        ("grpc.http2.min_ping_interval_without_data_ms", 1_000),
        ("grpc.http2.max_pings_without_data", 0),
    ]
    server = grpc.server(
        futures.ThreadPoolExecutor(max_workers=workers, thread_name_prefix="ddiloco-rpc"),
        handlers=[grpc.method_handlers_generic_handler(SERVICE, method_handlers)],
        interceptors=list(interceptors),
        options=options,
        maximum_concurrent_rpcs=None,
    )
    return server


def open_channel(
    address: str,
    plane: str,
    max_frame: int,
    credentials: object = None,  # grpc.ChannelCredentials or auth.Tls
    backoff: tuple[float, float] = (0.1, 1.0),
) -> grpc.Channel:
    """A channel with its own TCP connection, tagged by plane ("control" or "bulk"); `backoff` is the
    (initial, max) reconnect backoff in seconds (from `Timeouts`)."""
    options = _message_options(max_frame) + [
        ("grpc.use_local_subchannel_pool", 1),
        ("grpc.primary_user_agent", f"ddiloco-{plane}"),
        ("grpc.keepalive_time_ms", 10_000),
        ("grpc.keepalive_permit_without_calls", 1),
        ("grpc.enable_retries", 0),
        ("grpc.initial_reconnect_backoff_ms", max(1, int(backoff[0] * 1000))),
        ("grpc.max_reconnect_backoff_ms", max(1, int(backoff[1] * 1000))),
    ]
    if credentials is not None:
        from .auth import grpc_part

        # cast: a client is given channel credentials (see `credentials`), never a server's
        return grpc.secure_channel(address, cast(grpc.ChannelCredentials, grpc_part(credentials)), options=options)
    return grpc.insecure_channel(address, options=options)


class Stubs:
    """Callables for every method on one channel, with the auth token attached."""

    def __init__(self, channel: grpc.Channel, token: str | None) -> None:
        from .auth import TOKEN_METADATA

        self.metadata = ((TOKEN_METADATA, token),) if token else ()
        self._channel = channel
        self.unary: dict[str, grpc.UnaryUnaryMultiCallable[bytes, bytes]] = {
            m: channel.unary_unary(path(m)) for m in CONTROL_METHODS
        }
        self.push: grpc.StreamUnaryMultiCallable[bytes, bytes] = channel.stream_unary(path("Push"))
        self.subscribe: grpc.UnaryStreamMultiCallable[bytes, bytes] = channel.unary_stream(path("Subscribe"))
        self.fetch: grpc.UnaryStreamMultiCallable[bytes, bytes] = channel.unary_stream(path("Fetch"))
        self.donate: grpc.StreamUnaryMultiCallable[bytes, bytes] = channel.stream_unary(path("Donate"))
        self.recover: grpc.UnaryStreamMultiCallable[bytes, bytes] = channel.unary_stream(path("Recover"))

    def call(self, method: str, request: bytes, timeout: float) -> bytes:
        return self.unary[method](request, timeout=timeout, metadata=self.metadata)
