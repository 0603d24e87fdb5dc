"""The sending side of a shard link (`link.ShardLink`), on its own two threads.

* pusher: encodes contributions (quantised) and pushes them on the bulk channel (`uplink`);
* heartbeater: heartbeats and declines on the control channel.

Apart from `link` because it is the half of the link that only sends: the sessions it sends on, the
registration and the subscriber that receives stay there.
"""

from __future__ import annotations

import logging
import queue
import time
from typing import TYPE_CHECKING

import grpc

from ..core import Contribution, Decline
from ..wire import framing
from . import staging

if TYPE_CHECKING:
    import threading
    from typing import Protocol

    from ..wire import rpc
    from ..wire.timeouts import Timeouts
    from .uplink import Uplink
    from .wan import WanLink

    class SendContext(Protocol):
        """What the sending side uses of `link.LinkContext` (`link` imports this module: no import back)."""

        codec: str
        inbound: queue.Queue[tuple]
        wan: WanLink
        closing: threading.Event
        stop_requested: threading.Event
        global_progress: float

        def progress(self) -> dict: ...
        def delay(self) -> None: ...

    class SendStats(Protocol):
        """What the sending side counts in `link.LinkStats`."""

        pushed: int
        accepted: int
        rejected: int
        lost_in_transit: int
        bytes_pushed: int
        last_rejection: str


log = logging.getLogger("ddiloco.learner.link")  # the link's own logger, as before this module split off
PERMANENT = (
    grpc.StatusCode.UNAUTHENTICATED,
    grpc.StatusCode.FAILED_PRECONDITION,
    grpc.StatusCode.INVALID_ARGUMENT,
    grpc.StatusCode.PERMISSION_DENIED,
    grpc.StatusCode.UNIMPLEMENTED,
)


class Outbound:
    """Mixed into `ShardLink`, whose `__init__` makes the queues, channels and session these use."""

    index: int
    address: str
    ctx: SendContext
    timeouts: Timeouts
    stats: SendStats
    control: rpc.Stubs
    bulk: rpc.Stubs
    uplink: Uplink
    chunk_bytes: int
    _session: str | None
    _pushq: queue.Queue
    _ctrlq: queue.Queue

    if TYPE_CHECKING:  # the session methods of `ShardLink`

        def invalidate(self, sid: str | None) -> None: ...
        def _wait_session(self, timeout: float) -> str | None: ...

    def push(self, contribution: Contribution, extra: dict) -> None:
        self._pushq.put((contribution, extra))

    def decline(self, decline: Decline) -> None:
        self._ctrlq.put(decline)

    def _pusher(self) -> None:
        while not self.ctx.closing.is_set():
            try:
                item = self._pushq.get(timeout=self.timeouts.heartbeat)
            except queue.Empty:
                continue
            if item is None:
                return
            c, extra = item
            sid = self._wait_session(self.timeouts.failure)
            if sid is None:
                self.stats.lost_in_transit += 1  # the resync after registering retries it
                staging.release(c.outer_gradient)
                continue
            head = {
                "kind": "contribution",
                "session": sid,
                "fragment": c.fragment,
                "base_version": c.base_version,
                "steps": c.steps,
                "tokens": c.tokens,
                "seconds": c.seconds,
                "step_time": c.step_time,
                "step": c.step,
                **extra,
            }
            nbytes = framing.payload_nbytes(c.outer_gradient, self.ctx.codec)
            self.ctx.delay()
            try:
                reply, sent = self.uplink.push(
                    self.bulk,
                    head,
                    c.outer_gradient,
                    self.ctx.codec,
                    self.chunk_bytes,
                    self.timeouts.bulk(nbytes) + self.ctx.wan.transfer_seconds(nbytes),
                )
            except grpc.RpcError as exc:
                if self.ctx.closing.is_set():
                    return
                self.stats.lost_in_transit += 1
                log.info(
                    "push of fragment %d to %s failed (%s): %s",
                    c.fragment,
                    self.address,
                    exc.code().name,
                    exc.details(),
                )
                if exc.code() in PERMANENT:
                    self.stats.rejected += 1
                    self.stats.last_rejection = exc.details() or exc.code().name
                    self.ctx.inbound.put(("rejected", self.index, c.fragment, c.base_version, exc.details(), "retry"))
                else:
                    self.invalidate(sid)
                continue
            finally:
                staging.release(c.outer_gradient)
            self.stats.pushed += 1
            self.stats.bytes_pushed += sent
            if reply.get("ok"):
                self.stats.accepted += 1
                continue
            self.stats.rejected += 1
            self.stats.last_rejection = reply.get("reason", "")
            action = reply.get("action", "reset")
            log.log(
                logging.INFO if action == "none" else logging.WARNING,
                "synchronizer %s rejected fragment %d: %s (%s)",
                self.address,
                c.fragment,
                reply.get("reason"),
                action,
            )
            self.ctx.inbound.put(("rejected", self.index, c.fragment, c.base_version, reply.get("reason"), action))
            if action == "reregister":
                self.invalidate(sid)

    def _heartbeater(self) -> None:
        next_beat = 0.0
        while not self.ctx.closing.is_set():
            try:
                decline = self._ctrlq.get(timeout=max(0.0, next_beat - time.monotonic()))
            except queue.Empty:
                decline = None
            sid = self._session
            if decline is not None:
                if sid is not None:
                    head = {
                        "session": sid,
                        "fragment": decline.fragment,
                        "version": decline.version,
                        "reason": decline.reason,
                    }
                    self._call("Decline", head, sid)
                continue
            next_beat = time.monotonic() + self.timeouts.heartbeat
            if sid is None:
                continue
            reply = self._call("Heartbeat", {"session": sid, **self.ctx.progress()}, sid)
            if reply is None:
                continue
            if reply.get("stopping"):
                self.ctx.stop_requested.set()
            if isinstance(reply.get("progress"), (int, float)):
                self.ctx.global_progress = max(self.ctx.global_progress, float(reply["progress"]))
            if isinstance(reply.get("donate"), str):  # peer recovery: a joiner wants our inner state
                self.ctx.inbound.put(("donate", self.index, reply["donate"]))

    def _call(self, method: str, head: dict, sid: str) -> dict | None:
        self.ctx.delay()
        try:
            reply = framing.read_message(self.control.call(method, framing.message(head), self.timeouts.rpc))
        except grpc.RpcError as exc:
            if not self.ctx.closing.is_set():
                log.debug("%s to %s failed: %s", method, self.address, exc.code().name)
            return None
        if not reply.get("ok") and reply.get("action") == "reregister":
            self.invalidate(sid)
        return reply

    def pending_pushes(self) -> int:
        return self._pushq.qsize()
