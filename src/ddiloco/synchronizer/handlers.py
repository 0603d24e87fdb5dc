"""gRPC handlers: bytes in, `SynchronizerService` calls, bytes out.

Malformed input is answered with a gRPC error carrying the reason (INVALID_ARGUMENT,
RESOURCE_EXHAUSTED for sizes, FAILED_PRECONDITION for a model mismatch, UNAUTHENTICATED from the
interceptor); well-formed but unacceptable contributions (NaN, wrong shape, stale) get an ordinary
reply {"ok": false, "code", "reason"} (`wire.headers.Reply`) so the learner can act on its code.
Either way nothing changes and the rejection is logged with its reason. No exception from a handler
can take the service down.
"""

from __future__ import annotations

import functools
import logging
import math
import time
from collections.abc import Callable, Iterator
from typing import NoReturn, Protocol, cast

import grpc

from ..core import RejectCode
from ..core.round_sum import StreamedNorms
from ..wire import framing, reassembly
from ..wire.buffers import BufferPool
from ..wire.headers import CONTRIBUTION, ContributionHeader, session_of
from . import intake
from .donation_rpc import DonationRpc
from .ledger import PendingWork
from .one_thread import one_thread
from .service import SynchronizerService
from .settings import Refused
from .streams import Cancellable, Stream, StreamGuard

log = logging.getLogger(__name__)

# What malformed client input can raise while it is taken apart; anything else is our bug.
CLIENT_ERRORS = (ValueError, TypeError, KeyError, IndexError, AttributeError, OverflowError, RecursionError)
FLOAT_CODECS = ("bf16", "fp32")  # codecs whose values a push's norms may be taken from as they arrive
UNKNOWN_SESSION = "unknown session: the synchronizer restarted or declared this learner gone; register again"


class HandlerContext(Cancellable, Protocol):
    """What the handlers shared by both bulk planes use of a context: gRPC's, or `bulk_socket.SocketContext`."""

    def abort(self, code: grpc.StatusCode, details: str) -> NoReturn: ...


class Handlers:
    def __init__(self, service: SynchronizerService) -> None:
        self.service = service
        self.streams = StreamGuard(service.settings.timeouts, service.refuse_rpc)
        # contributions arrive into reused buffers: up to the owned model's float32 size kept between pushes
        self.push_buffers = BufferPool(self._fp32_bytes(service.core.owned))
        self.bulk_port: int | None = None  # the bulk socket plane's port, told to learners at registration

    def _fp32_bytes(self, fragments) -> int:
        """The float32 size of `fragments`' tensors."""
        names = self.service.core.plan.names
        return sum(4 * math.prod(self.service.shapes[n]) for p in fragments for n in names[p])

    def _bulk_deadline(self, nbytes: int) -> float:
        """A bulk stream's total limit: the learner's own deadline for that size, plus one failure timeout."""
        t = self.service.settings.timeouts
        return t.bulk(nbytes) + t.failure

    def table(self) -> dict[str, Callable]:
        return {
            "Register": self._guarded("Register", self.register),
            "Heartbeat": self._guarded("Heartbeat", self.heartbeat),
            "Decline": self._guarded("Decline", self.decline),
            "Leave": self._guarded("Leave", self.leave),
            "Status": self._guarded("Status", self.status),
            "Stop": self._guarded("Stop", self.stop),
            "Push": self._guarded("Push", self.push),
            "Subscribe": self.subscribe,
            "Fetch": self.fetch,
            **DonationRpc(self).table(),
        }

    def _guarded(self, method: str, handler: Callable) -> Callable:
        """Nothing a client sends raises out of a handler: input that slips past the checks below
        and still breaks something is refused (INVALID_ARGUMENT), counted and logged."""

        @functools.wraps(handler)
        def run(request: object, context: grpc.ServicerContext) -> bytes:
            try:
                return handler(request, context)
            except CLIENT_ERRORS as exc:
                log.debug("%s raised on client input", method, exc_info=True)
                self._abort(context, method, "INVALID_ARGUMENT", f"bad {method} request: {str(exc)[:200]}")
                raise  # unreachable: abort raises

        return run

    # --- helpers --------------------------------------------------------------------------------
    def _abort(self, context: HandlerContext, method: str, code: str, reason: str) -> NoReturn:
        self.service.refuse_rpc(method, reason)
        context.abort(getattr(grpc.StatusCode, code), reason)

    def _head(self, request: bytes, context: grpc.ServicerContext, method: str) -> dict:
        try:
            return framing.read_message(request)
        except framing.WireError as exc:
            self._abort(context, method, "INVALID_ARGUMENT", f"bad {method} request: {exc}")
            raise  # unreachable: abort raises

    # --- control plane --------------------------------------------------------------------------
    def register(self, request: bytes, context: grpc.ServicerContext) -> bytes:
        head = self._head(request, context, "Register")
        try:
            learner = intake.count(head, "learner", high=intake.MAX_LEARNER_ID)
            incarnation = intake.text(head, "incarnation", intake.MAX_ID_CHARS)
            signature = intake.text(head, "signature", intake.MAX_ID_CHARS)
            fresh = head.get("fresh", True)
            if not isinstance(fresh, bool):
                raise intake.BadField(f"field 'fresh' must be true or false, got {intake.show(fresh)}")
            holds = intake.digests(head, "holds", self.service.shapes)
        except intake.BadField as exc:
            self._abort(context, "Register", "INVALID_ARGUMENT", f"bad register request: {exc}")
        expected = self.service.identity["signature"]
        if signature != expected:
            self._abort(
                context,
                "Register",
                "FAILED_PRECONDITION",
                f"model mismatch: the learner's parameters (signature {signature}) differ from the "
                f"synchronizer's ({expected}); use the same model, size, sequence length and vocabulary",
            )
        try:
            reply = self.service.membership.register(learner, incarnation, fresh, holds)
        except Refused as exc:
            self._abort(context, "Register", exc.code, exc.reason)
        if self.bulk_port is not None:
            reply["bulk_port"] = self.bulk_port
        return framing.message(reply)

    # Out-of-range fields raise intake.BadField; `_guarded` answers INVALID_ARGUMENT naming the field.
    def heartbeat(self, request: bytes, context: grpc.ServicerContext) -> bytes:
        head = self._head(request, context, "Heartbeat")
        return framing.message(self.service.membership.heartbeat(head.get("session"), intake.progress(head)))

    def decline(self, request: bytes, context: grpc.ServicerContext) -> bytes:
        head = self._head(request, context, "Decline")
        fragment, version = intake.count(head, "fragment"), intake.count(head, "version")
        return framing.message(self.service.decline(head.get("session"), fragment, version, intake.reason(head)))

    def leave(self, request: bytes, context: grpc.ServicerContext) -> bytes:
        head = self._head(request, context, "Leave")
        tokens, finished = intake.optional_count(head, "tokens"), intake.flag(head, "finished")
        return framing.message(self.service.membership.leave(head.get("session"), tokens, finished))

    def status(self, request: bytes, context: grpc.ServicerContext) -> bytes:
        self._head(request, context, "Status")
        return framing.message(self.service.status())

    def stop(self, request: bytes, context: grpc.ServicerContext) -> bytes:
        head = self._head(request, context, "Stop")
        self.service.begin_stop(intake.reason(head, "stop requested"))
        return framing.message({"ok": True})

    # --- bulk plane -----------------------------------------------------------------------------
    def push(self, request_iterator: Iterator[bytes], context: grpc.ServicerContext) -> bytes:
        service = self.service
        if not service.bulk_slots.acquire(blocking=False):
            self._abort(context, "Push", "RESOURCE_EXHAUSTED", "too many bulk transfers at once; retry later")
        key, stream = self.open_push(context)
        try:
            return self._push(request_iterator, context, key, stream)
        finally:
            self.streams.close(key)
            service.bulk_slots.release()

    def open_push(self, context: HandlerContext) -> tuple[int, Stream]:
        """A push's entry in the stream guard (either plane)."""
        return self.streams.open("Push", context, self._bulk_deadline(self.service.settings.max_message_bytes))

    def push_reassembler(self) -> reassembly.Reassembler:
        """Where a push's one message lands: size-limited, into the reused push buffers."""
        return reassembly.Reassembler(self.service.settings.max_message_bytes, max_open=1, pool=self.push_buffers)

    def _push(
        self, request_iterator: Iterator[bytes], context: grpc.ServicerContext, key: int, stream: Stream
    ) -> bytes:
        service = self.service
        reassembler = self.push_reassembler()
        msg, norms = None, None
        try:
            with one_thread():  # norms taken beside the transfer (`one_thread`)
                for data in request_iterator:
                    stream.waiting()  # the idle clock restarts with every frame
                    service.traffic.received(len(data))
                    if msg is not None:
                        raise framing.WireError("a push carries exactly one contribution")
                    if stream.session is None:
                        early = self.first_frame(framing.unpack_frame(data)[0], key, stream, context)
                        if early is not None:
                            return early
                    msg = reassembler.feed(data)
                    norms = self.push_norms(reassembler, norms)
            if msg is None:
                raise framing.WireError("the push ended before its contribution was complete")
        except framing.WireError as exc:
            code = "RESOURCE_EXHAUSTED" if isinstance(exc, framing.MessageTooLarge) else "INVALID_ARGUMENT"
            self._abort(context, "Push", code, f"bad contribution: {exc}")
        except grpc.RpcError:  # cancelled by the stream guard (idle or too long) or by the client
            context.abort(grpc.StatusCode.DEADLINE_EXCEEDED, stream.cancelled or "push cancelled")
        return self.contribution_reply(msg, context, norms)

    def push_norms(self, reassembler: reassembly.Reassembler, norms: StreamedNorms | None) -> StreamedNorms | None:
        """After each frame of a push: the norms of its outer gradient taken as it arrives
        (`core.StreamedNorms`), made at its first frame when its head names an owned fragment's tensors
        in a float codec, else None (its norms are then taken whole once it is in)."""
        filling = reassembler.filling
        if filling is None:
            return norms
        head, buf, filled, frames_in = filling
        if frames_in == 1:
            norms = self._streamed_norms(head, buf)
        if norms is not None:
            norms.advance(filled)
        return norms

    def _streamed_norms(self, head: dict, buf: memoryview) -> StreamedNorms | None:
        fragment = head.get("fragment")
        service = self.service
        if head.get("kind") != CONTRIBUTION or not isinstance(fragment, int) or fragment not in service.core.versions:
            return None
        try:
            specs = reassembly.Message(head, buf).specs()
            if not all(s.codec in FLOAT_CODECS for s in specs):
                return None
            expected = {n: service.shapes[n] for n in service.core.plan.names[fragment]}
            views = framing.decode_tensors(specs, buf, expected, wire_dtype=True)
        except (framing.WireError, ValueError):
            return None  # refused with its reason once it is in
        offsets, at = {}, 0
        for s in specs:
            offsets[s.name], at = at, at + s.nbytes
        return StreamedNorms(views, offsets)

    def contribution_reply(
        self, msg: reassembly.Message, context: HandlerContext, norms: StreamedNorms | None = None
    ) -> bytes:
        """A complete pushed message taken in (any plane): the reply to send. `norms`: its tensors'
        norms as they were taken while it arrived (`push_norms`)."""
        service = self.service
        head = msg.head
        if head.get("kind") != CONTRIBUTION:
            self._abort(context, "Push", "INVALID_ARGUMENT", f"expected a contribution, got {head.get('kind')!r}")
        session = service.membership.session(session_of(head))
        try:
            h = ContributionHeader.decode(head, now=time.time(), max_overlap=service.core.config.sync_every - 1)
        except intake.BadField as exc:
            reason = f"malformed contribution header: {exc}"
            return framing.message(service.reject(session, None, RejectCode.MALFORMED, reason))
        fragment = h.fragment
        if session is None:
            return framing.message(service.reject(None, fragment, RejectCode.UNKNOWN_SESSION, UNKNOWN_SESSION))
        if fragment not in service.core.versions:
            return framing.message(
                service.reject(
                    None,
                    fragment,
                    RejectCode.NOT_OWNED,
                    f"fragment {fragment} is not owned by shard {service.settings.shard} (owns {service.core.owned})",
                    session.learner,
                )
            )
        expected = {n: service.shapes[n] for n in service.core.plan.names[fragment]}
        try:
            grads = msg.tensors(expected, wire_dtype=True)  # bf16 stays in its received bytes until summed
        except (framing.WireError, ValueError) as exc:
            return framing.message(
                service.reject(session, fragment, RejectCode.BAD_TENSORS, f"fragment {fragment}: {exc}")
            )
        stamp = h.stamp
        work = PendingWork(
            position=stamp.position,
            incarnation=session.incarnation,
            span_start=stamp.span_start,
            snapshot_wall=stamp.snapshot_wall,
            final=stamp.final,
        )
        return framing.message(
            service.contribute(
                session,
                h.contribution(session.learner, grads),
                work,
                stamp.tokens_total,
                norms.norms() if norms is not None else None,
            )
        )

    def first_frame(self, frame: dict, key: int, stream: Stream, context: HandlerContext) -> bytes | None:
        """Look at a push's first frame header: a reply to send at once (unknown session), or None to go
        on. An unknown session is answered before the payload is read, and a known one may only have
        `MAX_PUSHES_PER_SESSION` pushes in flight."""
        head = cast(dict, frame.get("head")) if isinstance(frame.get("head"), dict) else {}
        session = self.service.membership.session(session_of(head))
        if session is None:
            fragment = head.get("fragment") if isinstance(head.get("fragment"), int) else None
            return framing.message(self.service.reject(None, fragment, RejectCode.UNKNOWN_SESSION, UNKNOWN_SESSION))
        refused = self.streams.claim(key, session.id)
        if refused is not None:
            self._abort(context, "Push", "RESOURCE_EXHAUSTED", f"{refused}; retry later")
        if isinstance(head.get("nbytes"), int):
            stream.total = self._bulk_deadline(max(0, head["nbytes"]))
        return None

    def subscribe(self, request: bytes, context: grpc.ServicerContext) -> Iterator[bytes]:
        head = self._head(request, context, "Subscribe")
        service = self.service
        session = service.membership.session(head.get("session"))
        if session is None:
            context.abort(grpc.StatusCode.NOT_FOUND, "unknown session: register again")
        if not service.bulk_slots.acquire(blocking=False):
            self._abort(context, "Subscribe", "RESOURCE_EXHAUSTED", "too many bulk streams at once; retry later")
        key, stream = self.streams.open("Subscribe", context)
        try:
            self.streams.claim(key, session.id)  # replaces an older Subscribe of this session
            wait = service.settings.timeouts.heartbeat
            while context.is_active() and not session.outbox.closed and stream.cancelled is None:
                stream.not_waiting()
                frame = session.outbox.get(wait)
                if frame is not None:
                    stream.waiting()  # until the learner takes the frame: one that never reads is cut off
                    service.traffic.sent(len(frame))
                    yield frame
        finally:
            self.streams.close(key)
            service.bulk_slots.release()

    def fetch(self, request: bytes, context: grpc.ServicerContext) -> Iterator[bytes]:
        self._head(request, context, "Fetch")
        for parts in self.fetch_frames(context):
            yield b"".join(parts)

    def fetch_frames(self, context: HandlerContext) -> Iterator[list]:
        """The global model a fragment at a time, as frame parts (`framing.iter_frame_parts`), sent
        from the live tensors: each fragment's are taken under the lock, and a merge of it while they
        are being sent steps a copy instead (`readers`), so every fragment goes out whole at the
        version its head names, with no copy made per fetch and the lock held only to take them."""
        service, core = self.service, self.service.core
        with service.lock:
            owned = sorted(core.owned)
        key, stream = self.streams.open("Fetch", context, self._bulk_deadline(self._fp32_bytes(owned)))
        try:
            for p in owned:
                with service.lock:
                    head = {"kind": "fragment", "fragment": p, "version": core.versions[p]}
                    live = {n: core.params[n] for n in core.plan.names[p]}
                    service.readers.hold(p)
                try:
                    for parts in framing.iter_frame_parts(head, live, "fp32", service.settings.chunk_bytes):
                        stream.waiting()
                        yield parts
                finally:
                    with service.lock:
                        service.readers.release(p)
                del live
        finally:
            self.streams.close(key)
