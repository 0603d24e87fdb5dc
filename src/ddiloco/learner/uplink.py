"""How a shard link sends a contribution: on the synchronizer's bulk socket plane when it offers one
(`wire.sockets`: each frame sent from the snapshot's memory, no gRPC copies), else as a gRPC Push.

A bulk port that cannot be reached (a firewall that lets only the gRPC port through, or a flood that
fills the synchronizer's waiting places or its listen queue) is set aside for gRPC, with a warning,
and tried again after `SOCKET_RETRY_SECONDS`, twice as long each time it still fails (at most
`SOCKET_RETRY_MAX_SECONDS`), and at once on the next registration: a connection flood must not
cost the learner the socket plane for the rest of its session (#46). A push the bulk socket drops or
refuses for lack of room (connections that flood it, no free slot) goes over gRPC instead, and the
socket stays the first choice for the next one: a flood on one plane cannot lock the learner out.

The socket is for short links only. A bulk push opens a connection of its own (a handshake, the
greeting, the tensors, the reply: three round trips or more), where gRPC keeps one connection open;
the socket's gain is the copies it saves, which matter where bytes move fast, not where round trips
dominate: on a long link a learner pushing one fragment per step falls behind (docs/runtime.md, "The
socket is for short links"). So once the link's measured round trip (heartbeats,
`overlap.LinkTime`) exceeds `BULK_MAX_ROUND_TRIP`, pushes go over gRPC, and back on the socket below
`BULK_RETURN_ROUND_TRIP`; each change is logged.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping

import grpc
import torch

from ..records.ratelimit import RateLimit
from ..wire import auth, framing, rpc, sockets
from .overlap import LinkTime
from .wan import WanLink

log = logging.getLogger(__name__)

# A bulk socket push that failed with one of these is sent again over gRPC at once.
FALLBACK_CODES = (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.RESOURCE_EXHAUSTED, grpc.StatusCode.DEADLINE_EXCEEDED)
BULK_MAX_ROUND_TRIP = 0.02  # s: beyond this (another site), a connection per push costs more than copies save
BULK_RETURN_ROUND_TRIP = 0.01  # s: and back on the socket only below this, so a link near the line does not flap
SOCKET_RETRY_SECONDS = 5.0  # after the bulk socket could not be reached: gRPC only for this long
SOCKET_RETRY_MAX_SECONDS = 120.0  # the pause doubles while the socket stays unreachable, up to this


class Uplink:
    def __init__(
        self, token: str | None, credentials: object, max_frame: int, wan: WanLink, link_time: LinkTime | None = None
    ) -> None:
        self.token, self.credentials, self.max_frame, self.wan = token, credentials, max_frame, wan
        self.link_time = link_time
        self.socket: sockets.BulkSocketClient | None = None
        self.long_link = False  # the measured round trip sends pushes over gRPC (see the module's docstring)
        self.fallbacks = 0  # pushes the bulk socket failed and gRPC carried
        self.socket_paused_until = 0.0  # monotonic time: the unreachable socket set aside until then
        self._socket_pause = 0.0  # the last pause (0: the socket was reached, or never failed)
        self._fallback_log = RateLimit(per_second=0.2, burst=3)

    def configure(self, address: str, reply: Mapping) -> None:
        """From a registration reply: the bulk socket to use, if the synchronizer offers one we can use."""
        port = reply.get("bulk_port")
        self.socket = None
        self.socket_paused_until, self._socket_pause = 0.0, 0.0
        if not isinstance(port, int) or not 1 <= port <= 65535:
            return
        if self.credentials is not None and auth.ssl_part(self.credentials) is None:
            log.info(
                "the synchronizer offers a bulk socket, but TLS was given as bare gRPC credentials "
                "(use auth.channel_credentials(ca) for both planes); pushing over gRPC"
            )
            return
        host = address.rpartition(":")[0]
        self.socket = sockets.BulkSocketClient(host, port, self.token, self.max_frame, auth.ssl_part(self.credentials))

    def on_socket(self) -> bool:
        """Whether the next push goes to the bulk socket (offered, reachable, a short link)."""
        return self.socket is not None and time.monotonic() >= self.socket_paused_until and not self._long_link()

    def push(
        self, bulk: rpc.Stubs, head: dict, tensors: Mapping[str, torch.Tensor], codec: str, chunk: int, timeout: float
    ) -> tuple[dict, int]:
        """Send one contribution; (the synchronizer's reply, frame bytes sent). Raises grpc.RpcError."""
        client = self.socket if self.on_socket() else None
        if client is not None:
            self.wan.handshake(tls=client.tls is not None)  # one connection per push on this plane
            try:
                answer = client.push(framing.iter_frame_parts(head, tensors, codec, chunk), timeout, self.wan.sent)
                self._socket_pause = 0.0
                return answer
            except sockets.ConnectFailed as exc:
                pause = min(SOCKET_RETRY_MAX_SECONDS, 2 * self._socket_pause or SOCKET_RETRY_SECONDS)
                self._socket_pause, self.socket_paused_until = pause, time.monotonic() + pause
                log.warning(
                    "cannot reach the synchronizer's bulk socket %s:%d (%s); pushing over gRPC, the socket "
                    "again in %.0f s",
                    client.host,
                    client.port,
                    exc.details(),
                    pause,
                )
            except sockets.SocketRpcError as exc:
                if exc.code() not in FALLBACK_CODES:
                    raise
                self.fallbacks += 1
                dropped = self._fallback_log.allow()
                if dropped is not None:
                    log.warning(
                        "the bulk socket %s:%d failed a push (%s: %s); this one goes over gRPC%s",
                        client.host,
                        client.port,
                        exc.code().name,
                        exc.details(),
                        f" ({dropped} more such lines held back)" if dropped else "",
                    )
        # made frame by frame as gRPC sends them; then the snapshot's buffers serve the next one
        frames = framing.Counted(framing.iter_tensor_frames(head, tensors, codec, chunk))
        reply = bulk.push(self.wan.paced_up(frames), timeout=timeout, metadata=bulk.metadata)
        return framing.read_message(reply), frames.nbytes

    def _long_link(self) -> bool:
        """Whether the measured round trip is too long for a connection per push (with hysteresis)."""
        if self.link_time is None or self.link_time.round_trip.value is None:
            return self.long_link
        rtt = self.link_time.round_trip.get()
        limit = BULK_RETURN_ROUND_TRIP if self.long_link else BULK_MAX_ROUND_TRIP
        long_link = rtt > limit
        if long_link != self.long_link and self.socket is not None:
            log.info(
                "link round trip %.1f ms: pushing over %s%s",
                rtt * 1000,
                "gRPC (one connection kept open; a bulk-socket push opens its own)" if long_link else "the bulk socket",
                "" if long_link else " again",
            )
        self.long_link = long_link
        return long_link
