"""A learner's connection to one synchronizer shard, run entirely by background threads.

Three threads per shard, none of which the training loop ever waits on:

* subscriber: holds a session (registering again whenever it is lost) and a server stream on the
  bulk channel; decodes updates and pull requests into the client's inbound queue;
* pusher: encodes contributions (quantised) and pushes them on the bulk channel;
* heartbeater: heartbeats and declines on the control channel (these two: `outbound`).

Any transport failure drops the session; the subscriber registers again (with backoff) and posts a
"resync" event carrying the synchronizer's versions, from which the training thread works out what
to resend and what to overwrite (see `client`). So a restarted synchronizer, a learner declared gone
after a SIGSTOP, or a dropped connection all heal the same way.
"""

from __future__ import annotations

import contextlib
import logging
import math
import queue
import random
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import cast

import grpc

from ..core import Contribution, Decline, FragmentRequest, FragmentUpdate
from ..records.supervise import Supervisor, run_supervised
from ..wire import auth, framing, reassembly, rpc, runend
from ..wire.buffers import BufferPool
from ..wire.delta import DELTA_CODECS
from ..wire.headers import WorkStamp
from ..wire.timeouts import Timeouts
from . import addresses, staging
from .ending import DEFAULT_ORPHAN_TIMEOUT, RunFinished
from .held import HeldValues
from .initial import InitialValues, kept
from .outbound import MAX_IN_FLIGHT, PERMANENT, Outbound
from .overlap import LinkTime
from .uplink import Uplink
from .wan import DelayLine, WanLink

log = logging.getLogger(__name__)


def merged_learners(value: object) -> tuple[int, ...] | None:
    """An update's "admitted" list (who the merge took), or None where it is absent or malformed."""
    if not isinstance(value, list) or len(value) > 65536:
        return None
    if not all(isinstance(m, int) and not isinstance(m, bool) and m >= 0 for m in value):
        return None
    return tuple(value)


class SynchronizerError(RuntimeError):
    """The synchronizer refused us for a reason that retrying will not fix (auth, model mismatch...)."""


@dataclass
class LinkStats:
    pushed: int = 0
    accepted: int = 0
    rejected: int = 0
    lost_in_transit: int = 0
    registrations: int = 0
    bytes_pushed: int = 0
    bytes_received: int = 0
    last_rejection: str = ""
    moves: int = 0  # times the shard's address file named a new address


@dataclass
class LinkContext:
    """What every link of one client shares."""

    learner: int
    incarnation: str
    signature: str
    token: str | None
    codec: str
    inbound: queue.Queue[tuple]
    progress: Callable[[], dict]
    credentials: object = None
    net_delay: float = 0.0  # chaos testing: seconds added per message (and per donation frame)
    wan: WanLink = field(default_factory=WanLink)  # an emulated wide-area link (none by default)
    max_frame: int = 256 << 20  # what this side accepts per frame; the synchronizer's own limit protects it
    pin_memory: bool = False  # the model is on CUDA: arrivals are staged in page-locked host memory
    initial: InitialValues | None = None  # offered with the first registration (`wire.digest`)
    arrivals: BufferPool = field(default_factory=lambda: BufferPool(0))  # reused update buffers, sized at register
    closing: threading.Event = field(default_factory=threading.Event)
    stop_requested: threading.Event = field(default_factory=threading.Event)
    global_progress: float = 0.0
    orphan_timeout: float = DEFAULT_ORPHAN_TIMEOUT  # a link registers again for this long after the last answer

    def delay(self) -> None:
        """A message's latency: the chaos delay, then the emulated link's."""
        if self.net_delay:
            time.sleep(self.net_delay)
        self.wan.delay()


class ShardLink:
    def __init__(self, index: int, spec: str, ctx: LinkContext, timeouts: Timeouts) -> None:
        """`spec`: host:port, or @FILE, an address file read again whenever the shard stops answering."""
        self.index = index
        self.spec = spec
        self.address = addresses.resolve(spec)
        self.ctx = ctx
        self.timeouts = timeouts
        self.stats = LinkStats()
        self.control, self.bulk = self._open(self.address)
        self._line = DelayLine(ctx.wan, self._hand_on, ctx.closing)  # updates' latency, pipelined
        self.link_time = LinkTime()  # this link's measured round trips and pushes (`overlap`)
        self.uplink = Uplink(ctx.token, ctx.credentials, ctx.max_frame, ctx.wan, self.link_time)
        self.outbound = Outbound(index, self, ctx, self.stats, self.uplink, self.link_time)  # the sending side
        self.info: dict = {}
        self.held = HeldValues()  # the values differences apply to (`codec_down` int8 / int4)
        self._session: str | None = None
        self._session_cond = threading.Condition()
        self._stream: grpc._CallIterator[bytes] | None = None  # the Subscribe stream while it is open
        self._threads: list[threading.Thread] = []
        self.chunk_bytes = framing.DEFAULT_CHUNK_BYTES
        self._last_register_log = 0.0
        self.contact = time.monotonic()  # the last answer from the shard (`ending`: how long it has been silent)

    def _open(self, address: str) -> tuple[rpc.Stubs, rpc.Stubs]:
        backoff = (self.timeouts.backoff_min, self.timeouts.backoff_max)
        return cast(
            "tuple[rpc.Stubs, rpc.Stubs]",  # one for each of the two kinds
            tuple(
                rpc.Stubs(
                    rpc.open_channel(address, kind, self.ctx.max_frame, self.ctx.credentials, backoff), self.ctx.token
                )
                for kind in ("control", "bulk")
            ),
        )

    def _follow_address(self) -> None:
        """Move to the address the shard's file names now, if it moved (calls on the old channels end)."""
        moved = addresses.reread(self.spec, self.address)
        if moved is None:
            return
        log.warning("synchronizer shard %d moved from %s to %s", self.index, self.address, moved)
        old = (self.control, self.bulk)
        self.address = moved
        self.control, self.bulk = self._open(moved)
        self.stats.moves += 1
        for stubs in old:
            stubs._channel.close()

    # --- sessions -------------------------------------------------------------------------------
    @property
    def session(self) -> str | None:
        return self._session

    def _set_session(self, sid: str | None) -> None:
        with self._session_cond:
            self._session = sid
            self._session_cond.notify_all()

    def invalidate(self, sid: str | None) -> None:
        with self._session_cond:
            if sid is not None and self._session == sid:
                self._session = None
                self._session_cond.notify_all()
        stream = self._stream
        if stream is not None:
            stream.cancel()

    def wait_session(self, timeout: float) -> str | None:
        with self._session_cond:
            self._session_cond.wait_for(lambda: self._session is not None or self.ctx.closing.is_set(), timeout)
            return self._session

    def register(self, fresh: bool, deadline: float | None = None) -> dict:
        """Register (retrying with backoff until `deadline`); SynchronizerError on a permanent refusal."""
        head = {
            "kind": "register",
            "learner": self.ctx.learner,
            "incarnation": self.ctx.incarnation,
            "signature": self.ctx.signature,
            "fresh": fresh,
        }
        if fresh and self.ctx.initial is not None:
            head["holds"] = self.ctx.initial.digests
        delay = self.timeouts.backoff_min
        while True:
            try:
                reply = framing.read_message(self.control.call("Register", framing.message(head), self.timeouts.rpc))
                break
            except grpc.RpcError as exc:
                if exc.code() in PERMANENT:
                    raise SynchronizerError(
                        f"synchronizer {self.address} refused registration: {exc.details()}"
                    ) from None
                self._check_finished()
                now = time.monotonic()
                if now - self._last_register_log > 5.0:
                    self._last_register_log = now
                    until = deadline if fresh else self.orphan_deadline()  # the subscriber calls again until then
                    left = "" if until is None else f" for {max(0.0, until - now):.0f} s more"
                    log.warning(
                        "synchronizer %s does not answer yet (%s: %s); retrying%s",
                        self.address,
                        exc.code().name,
                        exc.details(),
                        left,
                    )
                self._follow_address()
                given_up = self.ctx.closing.is_set() or (fresh and self.ctx.stop_requested.is_set())
                if given_up or (deadline is not None and now + delay > deadline):
                    # a certificate that does not name the address fails as UNAVAILABLE too: say so
                    mismatch = auth.tls_mismatch(self.address, self.ctx.credentials)
                    raise ConnectionError(
                        f"synchronizer {self.address}: {mismatch}"
                        if mismatch is not None
                        else f"no answer from synchronizer {self.address} ({exc.code().name}: "
                        f"{exc.details()}); is it running, and is the address right?"
                    ) from None
                time.sleep(delay * (0.5 + random.random()))
                delay = min(2 * delay, self.timeouts.backoff_max)
        self.contact = time.monotonic()
        self.info = reply
        self.timeouts = Timeouts.from_dict(reply["timeouts"])
        self.chunk_bytes = int(reply.get("chunk_bytes", self.chunk_bytes))
        self.outbound.push_width = min(MAX_IN_FLIGHT, max(1, int(reply.get("pushes_per_session", 1))))
        self.uplink.configure(self.address, reply)
        self.stats.registrations += 1
        self.outbound.take_grant(reply)
        if reply.get("stopping"):
            self.ctx.stop_requested.set()
        if reply.get("finished") is True:  # the run is over and drained: nothing we send is merged now
            position = reply.get("resume_position")
            books = {str(self.ctx.learner): {"merged_position": position if isinstance(position, int) else 0}}
            self.ctx.inbound.put(("finished", self.index, {"finished": True, "books": books}))
        if not fresh:
            versions = {int(p): int(v) for p, v in reply["versions"].items()}
            holding = {int(p): int(v) for p, v in reply.get("holding", {}).items() if int(p) in versions}
            self.ctx.inbound.put(("resync", self.index, versions, holding))
        self._set_session(reply["session"])
        return reply

    def _check_finished(self) -> None:
        """RunFinished if the shard's address file is marked finished (`wire.runend`): its port is closed
        for good, and retrying would only train on alone."""
        if not addresses.is_file_spec(self.spec):
            return
        mark = runend.read(self.spec[1:])
        if mark is not None:
            raise RunFinished(f"synchronizer {self.address} has finished the run (marked in {self.spec[1:]})", mark)

    def orphan_deadline(self) -> float:
        """Registering again is given up this long after the shard's last answer (`ending`)."""
        return self.contact + self.ctx.orphan_timeout

    # --- threads --------------------------------------------------------------------------------
    def start(self) -> None:
        threads = (("sub", self._subscriber), ("push", self.outbound.pusher), ("beat", self.outbound.heartbeater))
        for name, target in threads:
            t = threading.Thread(target=self._guard(target), name=f"ddiloco-{name}-{self.index}", daemon=True)
            t.start()
            self._threads.append(t)

    def _guard(self, target: Callable[[], None]) -> Callable[[], None]:
        """A link thread never dies silently: a loop that raises is logged (its traceback once) and
        started again after a backoff, until the client closes. The session is dropped first, as a
        failed push drops it: work the thread held (a push in flight) is then resynced when the link
        registers again, instead of being waited for forever."""
        supervisor = Supervisor(f"link {self.address} {target.__name__.strip('_')} thread", log)

        def step() -> bool:
            target()
            return False  # the loop returned: the link is closing

        def pause(seconds: float) -> bool:
            self.invalidate(self._session)
            return not self.ctx.closing.wait(seconds)

        def run() -> None:
            run_supervised(step, pause, supervisor)

        return run

    def _subscriber(self) -> None:
        delay = self.timeouts.backoff_min
        while not self.ctx.closing.is_set():
            sid = self._session
            if sid is None:
                try:
                    deadline = min(time.monotonic() + self.timeouts.failure, self.orphan_deadline())
                    self.register(fresh=False, deadline=deadline)
                except RunFinished as exc:
                    log.warning("%s", exc)
                    self.ctx.inbound.put(("finished", self.index, exc.mark))
                    return
                except ConnectionError as exc:
                    if time.monotonic() >= self.orphan_deadline():  # the learner ends (`ending`)
                        self.ctx.inbound.put(("orphaned", self.index, str(exc)))
                        return
                    continue
                except SynchronizerError as exc:
                    log.error("%s", exc)
                    self.ctx.inbound.put(("fatal", self.index, str(exc)))
                    return
                sid = self._session
            try:
                self._stream = self.bulk.subscribe(framing.message({"session": sid}), metadata=self.bulk.metadata)
                self.ctx.arrivals.max_bytes = 4 * sum(math.prod(s) for s in self.info["plan"]["shapes"].values())
                reassembler = reassembly.Reassembler(1 << 40, max_open=8, pool=self.ctx.arrivals)
                self.held.reset(self.info.get("codec_down") in DELTA_CODECS)
                for frame in self._stream:
                    self.contact = time.monotonic()
                    self.stats.bytes_received += len(frame)
                    self.ctx.wan.received(len(frame))
                    msg = reassembler.feed(frame)
                    if msg is not None:
                        self._deliver(msg)
                    delay = self.timeouts.backoff_min
            except grpc.RpcError as exc:
                if not self.ctx.closing.is_set() and exc.code() != grpc.StatusCode.CANCELLED:
                    log.info("stream from %s broke (%s): reconnecting", self.address, exc.code().name)
            except framing.WireError as exc:
                log.error("bad frame from %s: %s", self.address, exc)
            finally:
                self._stream = None
            self.invalidate(sid)
            if not self.ctx.closing.is_set():
                time.sleep(delay * (0.5 + random.random()))
                delay = min(2 * delay, self.timeouts.backoff_max)

    def _deliver(self, msg: reassembly.Message) -> None:
        """Decode a message as it is read (in stream order, beside `held`), and hand its event on after
        the emulated link's latency (`wan.DelayLine`: at once without one)."""
        if self.ctx.net_delay:
            time.sleep(self.ctx.net_delay)
        head = msg.head
        kind = head.get("kind")
        if kind == "update":
            p = int(head["fragment"])
            shapes = self.info["plan"]["shapes"]
            expected = {n: tuple(shapes[n]) for n in self.info["plan"]["names"][p]}
            version = int(head["version"])
            values = kept(self.ctx.initial, expected) if head.get("held") is True else msg.tensors(expected)
            tensors = self.held.take(p, version, head.get("delta_from"), values)
            tensors = staging.pin(tensors, self.ctx.pin_memory)  # decoded here, not at the boundary
            update = FragmentUpdate(
                p, version, tensors, (self.ctx.learner,), merged_learners(head.get("admitted")), owned=True
            )
            self._line.put(("update", self.index, update, bool(head.get("force")), head.get("merged") or {}))
        elif kind == "merged":  # our final work went into this version; a leaving learner takes no values
            self._line.put(
                ("merged", self.index, int(head["fragment"]), int(head["version"]), head.get("merged") or {})
            )
        elif kind == "request":
            request = FragmentRequest(int(head["fragment"]), int(head["version"]), (self.ctx.learner,))
            self._line.put(("request", self.index, request))
        elif kind == "stop":
            self._line.put(("stop", self.index))

    def _hand_on(self, event: object) -> None:
        event = cast("tuple", event)
        if event[0] == "stop":
            self.ctx.stop_requested.set()
        self.ctx.inbound.put(event)

    # --- sending (`outbound`) ---------------------------------------------------------------------
    def push(self, contribution: Contribution, stamp: WorkStamp) -> None:
        self.outbound.push(contribution, stamp)

    def decline(self, decline: Decline) -> None:
        self.outbound.decline(decline)

    def pending_pushes(self) -> int:
        """Contributions queued or under way on this link."""
        return self.outbound.pending_pushes()

    def beat_now(self) -> None:
        """Heartbeat at once (its reply may carry a larger token grant)."""
        self.outbound.beat_now()

    @property
    def allowed(self) -> int | None:
        """Tokens the shard lets this learner train up to (`synchronizer.grants`); None: no limit."""
        return self.outbound.allowed

    def leave(self, tokens: int, finished: bool = False) -> None:
        """`finished`: the training loop is over (`finish`), not an error: the last learners leaving end the run."""
        sid = self._session
        if sid is None:
            return
        head = {"session": sid, "tokens": tokens, "finished": finished}
        with contextlib.suppress(grpc.RpcError):
            self.control.call("Leave", framing.message(head), self.timeouts.rpc)
        self._set_session(None)

    def close(self) -> None:
        self.ctx.closing.set()
        self.outbound.close()
        self.invalidate(self._session)
        with self._session_cond:
            self._session_cond.notify_all()
        for t in self._threads:
            t.join(timeout=2)
        self.control._channel.close()
        self.bulk._channel.close()
