"""The RPCs of peer recovery (see `donations`): Donor (ask / poll, control plane), Donate (the donor's
upload) and Recover (the joiner's download), on the bulk plane.

Everything a client sends is checked where it enters: the ticket must be this session's, every
state tensor must name a parameter of the model with its exact shape, scalars must be finite, the
upload must stay within four times the model's fp32 size, and the checksum must match what arrived.
A session may ask in a loop, so the lines its asks write are rate-limited.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from typing import Protocol, cast

import grpc

from ..core import RejectCode
from ..records.ratelimit import RateLimit
from ..wire import framing, reassembly
from ..wire.headers import Reply
from ..wire.protocol import state_checksum
from .service import SynchronizerService
from .streams import StreamGuard

log = logging.getLogger(__name__)


class HandlerKit(Protocol):
    """What these handlers use of `handlers.Handlers` (which builds them; no import back)."""

    service: SynchronizerService
    streams: StreamGuard

    def _guarded(self, method: str, handler: Callable) -> Callable: ...
    def _abort(self, context: grpc.ServicerContext, method: str, code: str, reason: str) -> None: ...
    def _head(self, request: bytes, context: grpc.ServicerContext, method: str) -> dict: ...
    def _bulk_deadline(self, nbytes: int) -> float: ...


class DonationRpc:
    def __init__(self, handlers: HandlerKit) -> None:
        self.h = handlers
        self.service = handlers.service
        self.desk = handlers.service.donations
        model_bytes = sum(4 * _numel(s) for s in self.service.shapes.values())
        self.limit = 4 * model_bytes + (1 << 20)
        self.ask_log = RateLimit(per_second=1.0, burst=10)  # one line per ask, but not one per loop turn

    def table(self) -> dict[str, Callable]:
        return {
            "Donor": self.h._guarded("Donor", self.donor),
            "Donate": self.h._guarded("Donate", self.donate),
            "Recover": self.recover,
        }

    def donor(self, request: bytes, context: grpc.ServicerContext) -> bytes:
        head = self.h._head(request, context, "Donor")
        session = self.service.membership.session(head.get("session"))
        if session is None:
            return framing.message(
                Reply.refused(RejectCode.UNKNOWN_SESSION, "unknown session: register again").encode()
            )
        op = head.get("op")
        if op == "ask":
            reply = self.desk.ask(session.learner, session.id, self.service.membership.donor_candidates())
            dropped = self.ask_log.allow()
            if dropped is not None:
                log.info(
                    "learner %d asks for inner state: %s%s",
                    session.learner,
                    f"donor learner {reply['donor']}" if reply["ok"] else reply["reason"],
                    f" ({dropped} more asks not logged: rate limit)" if dropped else "",
                )
            return framing.message(reply)
        if op == "poll":
            return framing.message(self.desk.poll(head.get("ticket"), session.id))
        raise ValueError(f"op must be ask or poll, got {str(op)[:20]!r}")

    def donate(self, request_iterator: Iterator[bytes], context: grpc.ServicerContext) -> bytes:
        service = self.service
        if not service.bulk_slots.acquire(blocking=False):
            self.h._abort(context, "Donate", "RESOURCE_EXHAUSTED", "too many bulk transfers at once; retry later")
        # a donor on a slow link may take long: the stream lives as long as its ticket (and is cut
        # off sooner only if it goes silent for a failure timeout)
        key, stream = self.h.streams.open("Donate", context, self.desk.ttl)
        ticket = None
        try:
            reassembler = reassembly.Reassembler(self.limit, max_open=1)
            msg = None
            for data in request_iterator:
                stream.waiting()
                if msg is not None:
                    raise framing.WireError("a donation is exactly one message")
                if ticket is None:  # the first frame names the ticket: the upload is under way
                    frame, _ = framing.unpack_frame(data)
                    first = cast(dict, frame.get("head")) if isinstance(frame.get("head"), dict) else {}
                    session = service.membership.session(first.get("session"))
                    if session is None:
                        raise ValueError("unknown session: register again")
                    self.desk.begin(first.get("ticket"), session.id)
                    ticket = first.get("ticket")
                msg = reassembler.feed(data)
            if msg is None:
                raise framing.WireError("the donation ended before it was complete")
            head = msg.head
            session = service.membership.session(head.get("session"))
            if head.get("kind") != "inner_state" or session is None or head.get("ticket") != ticket:
                raise ValueError("expected an inner_state message from a registered learner")
            expected = self.desk.expected(ticket, session.id, [spec.name for spec in msg.specs()])
            tensors = msg.tensors(expected)
            scalars = self.desk.check_scalars(head.get("scalars", {}))
            if not all(bool(t.isfinite().all()) for t in tensors.values()):
                raise ValueError("the donated state holds NaN or Inf")
            checksum = state_checksum(tensors, scalars)
            if checksum != head.get("checksum"):
                raise ValueError("the donated state does not match its checksum")
            self.desk.complete(cast(str, ticket), tensors, scalars, checksum)  # `begin` took it: a str
            log.info("learner %d donated its inner state (%d tensors)", session.learner, len(tensors))
            return framing.message({"ok": True})
        except (framing.WireError, ValueError) as exc:
            self.desk.fail(ticket, f"donation refused: {exc}")
            code = "RESOURCE_EXHAUSTED" if isinstance(exc, framing.MessageTooLarge) else "INVALID_ARGUMENT"
            self.h._abort(context, "Donate", code, f"bad donation: {exc}")
        except grpc.RpcError:  # the donor went away mid-transfer, or the stream guard cut it off
            self.desk.fail(ticket, "the donor's upload broke off")
            context.abort(grpc.StatusCode.DEADLINE_EXCEEDED, stream.cancelled or "donation cancelled")
        finally:
            if ticket is not None and self.desk.poll_state(ticket) == "uploading":
                self.desk.fail(ticket, "the donor's upload broke off")
            self.h.streams.close(key)
            service.bulk_slots.release()
        raise AssertionError("unreachable")  # every branch above returns or aborts

    def recover(self, request: bytes, context: grpc.ServicerContext) -> Iterator[bytes]:
        head = self.h._head(request, context, "Recover")
        session = self.service.membership.session(head.get("session"))
        if session is None:
            context.abort(grpc.StatusCode.NOT_FOUND, "unknown session: register again")
        try:
            ticket = self.desk.take(head.get("ticket"), session.id)
        except ValueError as exc:
            self.h._abort(context, "Recover", "FAILED_PRECONDITION", str(exc))
        nbytes = sum(t.numel() * 4 for t in ticket.tensors.values())
        key, stream = self.h.streams.open("Recover", context, self.h._bulk_deadline(nbytes))
        try:
            out = {"kind": "inner_state", "donor": ticket.donor, "scalars": ticket.scalars, "checksum": ticket.checksum}
            for frame in framing.tensor_frames(out, ticket.tensors, "fp32", self.service.settings.chunk_bytes):
                stream.waiting()
                yield frame
        finally:
            self.h.streams.close(key)


def _numel(shape: tuple[int, ...]) -> int:
    n = 1
    for d in shape:
        n *= d
    return n
