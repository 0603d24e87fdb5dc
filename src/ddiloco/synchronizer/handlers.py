"""gRPC handlers: bytes in, `SynchronizerService` calls, bytes out.

Malformed input is answered with a gRPC error carrying the reason (INVALID_ARGUMENT,
RESOURCE_EXHAUSTED for sizes, FAILED_PRECONDITION for a model mismatch, UNAUTHENTICATED from the
interceptor); well-formed but unacceptable contributions (NaN, wrong shape, stale) get an ordinary
reply {"ok": false, "reason", "action"} so the learner can act on it. Either way nothing changes and
the rejection is logged with its reason. No exception from a handler can take the service down.
"""

from __future__ import annotations

import logging
import math
import time
from typing import Callable, Iterator

import grpc

from ..core import Contribution
from ..wire import framing
from .ledger import PendingWork
from .service import SynchronizerService
from .settings import Refused

log = logging.getLogger(__name__)


class Handlers:
    def __init__(self, service: SynchronizerService) -> None:
        self.service = service

    def table(self) -> dict[str, Callable]:
        return {
            "Register": self.register,
            "Heartbeat": self.heartbeat,
            "Decline": self.decline,
            "Leave": self.leave,
            "Status": self.status,
            "Stop": self.stop,
            "Push": self.push,
            "Subscribe": self.subscribe,
            "Fetch": self.fetch,
        }

    # --- helpers --------------------------------------------------------------------------------
    def _abort(self, context: grpc.ServicerContext, method: str, code: str, reason: str) -> None:
        self.service.refuse_rpc(method, reason)
        context.abort(getattr(grpc.StatusCode, code), reason)

    def _head(self, request: bytes, context: grpc.ServicerContext, method: str) -> dict:
        try:
            return framing.read_message(request)
        except framing.WireError as exc:
            self._abort(context, method, "INVALID_ARGUMENT", f"bad {method} request: {exc}")
            raise  # unreachable: abort raises

    @staticmethod
    def _int(head: dict, key: str) -> int:
        value = head.get(key)
        if not isinstance(value, int) or isinstance(value, bool):
            raise ValueError(f"field {key!r} must be an integer, got {value!r}")
        return value

    @staticmethod
    def _num(head: dict, key: str) -> float:
        value = head.get(key)
        if not isinstance(value, (int, float)) or isinstance(value, bool) or not math.isfinite(value):
            raise ValueError(f"field {key!r} must be a finite number, got {value!r}")
        return float(value)

    # --- control plane --------------------------------------------------------------------------
    def register(self, request: bytes, context: grpc.ServicerContext) -> bytes:
        head = self._head(request, context, "Register")
        try:
            learner = self._int(head, "learner")
            incarnation = str(head["incarnation"])[:64]
            signature = head["signature"]
        except (KeyError, ValueError) as exc:
            self._abort(context, "Register", "INVALID_ARGUMENT", f"bad register request: {exc}")
        expected = self.service.identity["signature"]
        if signature != expected:
            self._abort(context, "Register", "FAILED_PRECONDITION",
                        f"model mismatch: the learner's parameters (signature {signature}) differ from the "
                        f"synchronizer's ({expected}); use the same model, size, sequence length and vocabulary")
        try:
            reply = self.service.register(learner, incarnation, bool(head.get("fresh", True)))
        except Refused as exc:
            self._abort(context, "Register", exc.code, exc.reason)
        return framing.message(reply)

    def heartbeat(self, request: bytes, context: grpc.ServicerContext) -> bytes:
        head = self._head(request, context, "Heartbeat")
        return framing.message(self.service.heartbeat(head.get("session"), head))

    def decline(self, request: bytes, context: grpc.ServicerContext) -> bytes:
        head = self._head(request, context, "Decline")
        try:
            fragment, version = self._int(head, "fragment"), self._int(head, "version")
        except ValueError as exc:
            self._abort(context, "Decline", "INVALID_ARGUMENT", f"bad decline: {exc}")
        return framing.message(self.service.decline(head.get("session"), fragment, version, str(head.get("reason", ""))[:200]))

    def leave(self, request: bytes, context: grpc.ServicerContext) -> bytes:
        head = self._head(request, context, "Leave")
        tokens = head.get("tokens")
        return framing.message(self.service.leave(head.get("session"), tokens if isinstance(tokens, int) else None))

    def status(self, request: bytes, context: grpc.ServicerContext) -> bytes:
        self._head(request, context, "Status")
        return framing.message(self.service.status())

    def stop(self, request: bytes, context: grpc.ServicerContext) -> bytes:
        head = self._head(request, context, "Stop")
        self.service.begin_stop(str(head.get("reason", "stop requested"))[:200])
        return framing.message({"ok": True})

    # --- bulk plane -----------------------------------------------------------------------------
    def push(self, request_iterator: Iterator[bytes], context: grpc.ServicerContext) -> bytes:
        service = self.service
        if not service.bulk_slots.acquire(blocking=False):
            self._abort(context, "Push", "RESOURCE_EXHAUSTED", "too many bulk transfers at once; retry later")
        try:
            return self._push(request_iterator, context)
        finally:
            service.bulk_slots.release()

    def _push(self, request_iterator: Iterator[bytes], context: grpc.ServicerContext) -> bytes:
        service = self.service
        reassembler = framing.Reassembler(service.settings.max_message_bytes, max_open=1)
        msg = None
        try:
            for data in request_iterator:
                if msg is not None:
                    raise framing.WireError("a push carries exactly one contribution")
                msg = reassembler.feed(data)
            if msg is None:
                raise framing.WireError("the push ended before its contribution was complete")
        except framing.WireError as exc:
            code = "RESOURCE_EXHAUSTED" if "exceeds the limit" in str(exc) else "INVALID_ARGUMENT"
            self._abort(context, "Push", code, f"bad contribution: {exc}")
        head = msg.head
        if head.get("kind") != "contribution":
            self._abort(context, "Push", "INVALID_ARGUMENT", f"expected a contribution, got {head.get('kind')!r}")
        session = service.session(head.get("session"))
        try:
            fragment = self._int(head, "fragment")
            base_version = self._int(head, "base_version")
            steps, tokens, step = self._int(head, "steps"), self._int(head, "tokens"), self._int(head, "step")
            position = self._int(head, "position")
            seconds, step_time = self._num(head, "seconds"), self._num(head, "step_time")
            tokens_total = head.get("tokens_total") if isinstance(head.get("tokens_total"), int) else None
        except ValueError as exc:
            return framing.message(service.reject(session, None, f"malformed contribution header: {exc}"))
        if session is None:
            return framing.message(service.reject(None, fragment, "unknown session: the synchronizer restarted or "
                                               "declared this learner gone; register again"))
        if fragment not in service.core.versions:
            return framing.message(service.reject(None, fragment, f"fragment {fragment} is not owned by shard "
                                               f"{service.settings.shard} (owns {service.core.owned})", session.learner))
        expected = {n: service.shapes[n] for n in service.core.plan.names[fragment]}
        try:
            grads = msg.tensors(expected)
        except (framing.WireError, ValueError) as exc:
            return framing.message(service.reject(session, fragment, f"fragment {fragment}: {exc}"))
        contribution = Contribution(
            learner=session.learner, fragment=fragment, base_version=base_version, outer_gradient=grads,
            steps=steps, tokens=tokens, seconds=seconds, step_time=step_time, step=step,
        )
        work = PendingWork(
            position=position,
            incarnation=session.incarnation,
            span_start=float(head.get("span_start", time.time())),
            snapshot_wall=float(head.get("snapshot_wall", time.time())),
        )
        return framing.message(service.contribute(session, contribution, work, tokens_total))

    def subscribe(self, request: bytes, context: grpc.ServicerContext) -> Iterator[bytes]:
        head = self._head(request, context, "Subscribe")
        service = self.service
        session = service.session(head.get("session"))
        if session is None:
            context.abort(grpc.StatusCode.NOT_FOUND, "unknown session: register again")
        if not service.bulk_slots.acquire(blocking=False):
            self._abort(context, "Subscribe", "RESOURCE_EXHAUSTED", "too many bulk streams at once; retry later")
        try:
            wait = service.settings.timeouts.heartbeat
            while context.is_active() and not session.outbox.closed:
                frame = session.outbox.get(wait)
                if frame is not None:
                    yield frame
        finally:
            service.bulk_slots.release()

    def fetch(self, request: bytes, context: grpc.ServicerContext) -> Iterator[bytes]:
        self._head(request, context, "Fetch")
        service = self.service
        versions, tensors = service.snapshot()
        for p, values in tensors.items():
            head = {"kind": "fragment", "fragment": p, "version": versions[p]}
            yield from framing.tensor_frames(head, values, "fp32", service.settings.chunk_bytes)
