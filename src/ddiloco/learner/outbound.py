"""The sending side of a shard link (`Outbound`, owned by `link.ShardLink`), on its own two threads.

* pusher: encodes contributions (quantised) and pushes them on the bulk channel (`uplink`);
* heartbeater: heartbeats and declines on the control channel.

The link keeps the sessions it sends on, the registration and the subscriber that receives; this side
reads them through `SendLink` and owns its queues and the count of pushes under way.
"""

from __future__ import annotations

import contextlib
import logging
import queue
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING

import grpc

from ..core import Contribution, Decline
from ..wire import framing
from ..wire.headers import ContributionHeader, Reply, WorkStamp
from . import staging
from .overlap import LinkTime

if TYPE_CHECKING:
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

    class SendLink(Protocol):
        """What the sending side uses of its `link.ShardLink`: where it sends and on which session, as
        the link's registration (or its shard's move) left them, so read at each use."""

        address: str
        timeouts: Timeouts
        control: rpc.Stubs
        bulk: rpc.Stubs
        chunk_bytes: int
        contact: float  # monotonic time of the shard's last answer (`ending`): the answers here count too

        @property
        def session(self) -> str | None: ...
        def invalidate(self, sid: str | None) -> None: ...
        def wait_session(self, timeout: float) -> str | None: ...


log = logging.getLogger("ddiloco.learner.link")  # the link's own logger, as before this module split off
MAX_IN_FLIGHT = 8  # pushes one link sends side by side behind an emulated long link (and the most it ever does)
WAKE = ("wake",)  # put on the push queue so that the pusher sees a failed push at once
BEAT = ("beat",)  # put on the control queue: heartbeat now (a learner waits at its token grant)
PERMANENT = (
    grpc.StatusCode.UNAUTHENTICATED,
    grpc.StatusCode.FAILED_PRECONDITION,
    grpc.StatusCode.INVALID_ARGUMENT,
    grpc.StatusCode.PERMISSION_DENIED,
    grpc.StatusCode.UNIMPLEMENTED,
)


class Outbound:
    """Owned by a `link.ShardLink`: the queues its pusher and heartbeater threads (`start` runs them)
    take contributions and declines from, the pushes under way, and the token grant the shard's
    replies carry."""

    def __init__(
        self, index: int, link: SendLink, ctx: SendContext, stats: SendStats, uplink: Uplink, link_time: LinkTime
    ) -> None:
        """`index`: the link's; `stats`: the link's counters, which the pushes book; `link_time`: this
        link's measured round trips and pushes (`overlap`)."""
        self.index = index
        self.link = link
        self.ctx = ctx
        self.stats = stats
        self.uplink = uplink
        self.link_time = link_time
        self.push_width = 1  # until a registration reply says how many pushes the synchronizer takes at once
        self._push_room = threading.Condition()  # guards `_pushing` and `_at_server`; notified as each push ends
        self._pushing = 0  # pushes under way (at most `push_width`), for `pending_pushes`
        self._at_server = 0  # pushes whose call is open at the synchronizer (at most `push_width`)
        self._push_error: Exception | None = None  # a push that raised, re-raised by the pusher thread
        self._stats_lock = threading.Lock()
        self._pushq: queue.Queue = queue.Queue()
        self._ctrlq: queue.Queue = queue.Queue()
        self.allowed: int | None = None  # the shard's token grant (`synchronizer.grants`); None: no limit

    def close(self) -> None:
        """The pusher ends when it comes to this in its queue (the link is closing)."""
        self._pushq.put(None)

    def push(self, contribution: Contribution, stamp: WorkStamp) -> None:
        self._pushq.put((contribution, stamp))

    def decline(self, decline: Decline) -> None:
        self._ctrlq.put(decline)

    def beat_now(self) -> None:
        """Heartbeat at once (its reply may carry a larger token grant)."""
        self._ctrlq.put(BEAT)

    def pusher(self) -> None:
        """Pushes side by side, as many as the synchronizer takes from one session at once
        (`push_width`, from its registration reply): on a long link each push waits several round
        trips (a connection, the reply), and one at a time they would queue up behind each other
        while the learner makes a new one every few steps. Behind an emulated link, up to
        MAX_IN_FLIGHT: its latency is spent here before each call reaches the synchronizer (`wan`)."""
        pool = ThreadPoolExecutor(MAX_IN_FLIGHT, thread_name_prefix=f"ddiloco-push-{self.index}")
        try:
            while not self.ctx.closing.is_set():
                try:
                    item = self._pushq.get(timeout=self.link.timeouts.heartbeat)
                except queue.Empty:
                    continue
                if item is None:
                    return
                width = MAX_IN_FLIGHT if self.ctx.wan.settings.active else self.push_width
                with self._push_room:  # bounded: a link that cannot keep up still pushes back
                    while self._pushing >= width and not self.ctx.closing.is_set() and self._push_error is None:
                        self._push_room.wait(self.link.timeouts.heartbeat)
                    error, self._push_error = self._push_error, None
                    if error is not None:  # this thread's supervisor logs it and resyncs (`link._guard`)
                        if item is not WAKE:
                            self._pushq.put(item)
                        raise error
                    if item is WAKE:
                        continue
                    self._pushing += 1
                pool.submit(self._push_in_flight, *item)
        finally:
            # not cancelled: a push submitted but not started yet is a contribution (and counted in
            # `_pushing`, which only its own end gives back); it runs, or sees the link closing
            pool.shutdown(wait=False)

    def _push_in_flight(self, c: Contribution, stamp: WorkStamp) -> None:
        error: Exception | None = None
        try:
            self._push_one(c, stamp)
        except Exception as exc:  # handed to the pusher thread: the pool would keep it where nobody reads
            error = exc
        finally:
            with self._push_room:
                self._pushing -= 1
                if error is not None and self._push_error is None:
                    self._push_error = error
                    self._pushq.put(WAKE)  # the pusher may be waiting for work: it must raise now
                self._push_room.notify_all()

    @contextlib.contextmanager
    def _server_slot(self) -> Iterator[None]:
        """Hold one of the `push_width` calls the synchronizer takes from this session at once. Behind
        an emulated link up to MAX_IN_FLIGHT pushes spend their latency side by side, but more than
        `push_width` open calls would be refused (RESOURCE_EXHAUSTED) and taken for a broken link;
        the synchronizer frees its slot before it replies, so a slot freed here is free there."""
        with self._push_room:
            while self._at_server >= self.push_width and not self.ctx.closing.is_set():
                self._push_room.wait(self.link.timeouts.heartbeat)
            self._at_server += 1
        try:
            yield
        finally:
            with self._push_room:
                self._at_server -= 1
                self._push_room.notify_all()

    def _push_one(self, c: Contribution, stamp: WorkStamp) -> None:
        sid = self.link.wait_session(self.link.timeouts.failure)
        if sid is None:
            self._count("lost_in_transit")  # the resync after registering retries it
            staging.release(c.outer_gradient)
            return
        head = ContributionHeader.of(c, stamp).encode(sid)
        nbytes = framing.payload_nbytes(c.outer_gradient, self.ctx.codec)
        started = time.monotonic()
        self.ctx.delay()
        try:
            with self._server_slot():
                reply, sent = self.uplink.push(
                    self.link.bulk,
                    head,
                    c.outer_gradient,
                    self.ctx.codec,
                    self.link.chunk_bytes,
                    self.link.timeouts.bulk(nbytes) + self.ctx.wan.transfer_seconds(nbytes),
                )
            self.ctx.wan.delay()  # the reply's way back
        except grpc.RpcError as exc:
            if self.ctx.closing.is_set():
                return
            self._count("lost_in_transit")
            log.info(
                "push of fragment %d to %s failed (%s): %s",
                c.fragment,
                self.link.address,
                exc.code().name,
                exc.details(),
            )
            if exc.code() in PERMANENT:
                self._count("rejected", exc.details() or exc.code().name)
                self.ctx.inbound.put(("rejected", self.index, c.fragment, c.base_version, exc.details(), "retry"))
            else:
                self.link.invalidate(sid)
            return
        finally:
            staging.release(c.outer_gradient)
        self.link.contact = time.monotonic()
        self.link_time.observe_push(time.monotonic() - started)
        self._count("pushed", sent=sent)
        self._answered(c, Reply.decode(reply), sid)

    def _answered(self, c: Contribution, reply: Reply, sid: str) -> None:
        """Act on the synchronizer's reply to contribution `c`: by its code (`Reply.action`), never by
        the reason, which is only logged and kept for the learner's stats."""
        if reply.ok:
            self._count("accepted")
            return
        self._count("rejected", reply.reason)
        action = reply.action
        log.log(
            logging.INFO if action == "none" else logging.WARNING,
            "synchronizer %s rejected fragment %d: %s (%s, %s)",
            self.link.address,
            c.fragment,
            reply.reason,
            reply.code.value if reply.code is not None else "no known code",
            action,
        )
        self.ctx.inbound.put(("rejected", self.index, c.fragment, c.base_version, reply.reason, action))
        if action == "reregister":
            self.link.invalidate(sid)

    def _count(self, what: str, rejection: str | None = None, sent: int = 0) -> None:
        """Book one push outcome; pushes may finish side by side (`pusher`)."""
        with self._stats_lock:
            setattr(self.stats, what, getattr(self.stats, what) + 1)
            self.stats.bytes_pushed += sent
            if rejection is not None:
                self.stats.last_rejection = rejection

    def heartbeater(self) -> None:
        next_beat = 0.0
        while not self.ctx.closing.is_set():
            try:
                decline = self._ctrlq.get(timeout=max(0.0, next_beat - time.monotonic()))
            except queue.Empty:
                decline = None
            sid = self.link.session
            if decline is not None and decline is not BEAT:
                if sid is not None:
                    head = {
                        "session": sid,
                        "fragment": decline.fragment,
                        "version": decline.version,
                        "reason": decline.reason,
                    }
                    self._call("Decline", head, sid)
                continue
            next_beat = time.monotonic() + self.link.timeouts.heartbeat
            if sid is None:
                continue
            reply = self._call("Heartbeat", {"session": sid, **self.ctx.progress()}, sid)
            if reply is None:
                continue
            if reply.get("stopping"):
                self.ctx.stop_requested.set()
            self.take_grant(reply)
            if isinstance(reply.get("progress"), (int, float)):
                self.ctx.global_progress = max(self.ctx.global_progress, float(reply["progress"]))
            if isinstance(reply.get("donate"), str):  # peer recovery: a joiner wants our inner state
                self.ctx.inbound.put(("donate", self.index, reply["donate"]))

    def take_grant(self, reply: dict) -> None:
        """The token grant of a registration's or a heartbeat's reply (absent: no token budget)."""
        allowed = reply.get("allowed")
        self.allowed = allowed if isinstance(allowed, int) and not isinstance(allowed, bool) and allowed >= 0 else None

    def _call(self, method: str, head: dict, sid: str) -> dict | None:
        started = time.monotonic()
        self.ctx.delay()
        try:
            reply = framing.read_message(self.link.control.call(method, framing.message(head), self.link.timeouts.rpc))
        except grpc.RpcError as exc:
            if not self.ctx.closing.is_set():
                log.debug("%s to %s failed: %s", method, self.link.address, exc.code().name)
            return None
        self.ctx.wan.delay()  # the reply's way back
        self.link.contact = time.monotonic()
        self.link_time.observe_round_trip(time.monotonic() - started)
        if Reply.decode(reply).action == "reregister":
            self.link.invalidate(sid)
        return reply

    def pending_pushes(self) -> int:
        """Contributions queued or under way on this link."""
        return self._pushq.qsize() + self._pushing
