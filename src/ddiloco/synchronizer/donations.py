"""Peer recovery of the inner optimizer state, relayed by the synchronizer.

A learner that starts without its own inner state (a new machine, an empty disk) asks for a donor
(`ask`). The desk picks the live learner with the most steps, and that learner's next heartbeat
reply carries the ticket; at its next step boundary it snapshots its optimizer state and uploads it
(`Donate`), with a checksum. The joiner polls (`poll`) and downloads it (`Recover`), verifies the
checksum and loads it. Only optimizer state moves this way, never parameters: the joiner takes the
global parameters as any learner does, so a donation cannot drag the global model anywhere.

A donor that dies, leaves or stalls fails its ticket (the joiner then asks again, or starts cold and
says so). At most one ticket is kept per joiner: a new request drops the joiner's older tickets at
once (a session asking in a loop must not grow Status past its header limit, issue 32), and each is
dropped once taken or after `ttl` seconds. Thread-safe with its own lock: nothing here waits on the
service's lock.
"""

from __future__ import annotations

import re
import secrets
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

import torch

KEY = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,31}$")
MAX_KEYS_PER_PARAM = 4
MAX_SCALAR = float(2**53)
SUMMARY_TICKETS = 32  # Status lists at most this many tickets (the newest), and counts them all


@dataclass
class Ticket:
    id: str
    joiner: int
    joiner_session: str
    donor: int
    donor_session: str
    created: float
    state: str = "asked"  # asked -> uploading -> ready -> taken | failed
    reason: str = ""
    tensors: dict[str, torch.Tensor] = field(default_factory=dict)
    scalars: dict = field(default_factory=dict)
    checksum: str = ""
    step: float = 0.0


class DonationDesk:
    def __init__(self, shapes: Mapping[str, tuple[int, ...]], ttl: float, alive: Callable[[str], bool]) -> None:
        self.shapes = dict(shapes)
        self.ttl = ttl
        self.alive = alive  # is this session id still registered?
        self.lock = threading.Lock()
        self.tickets: dict[str, Ticket] = {}
        self.donated = 0
        self.failed = 0
        self.bad_donors: set[str] = set()  # sessions whose donation failed: never asked again

    def ask(self, joiner: int, joiner_session: str, candidates: list[tuple[int, str, float]]) -> dict:
        """`candidates`: (learner, session id, steps) of the live learners. Picks the one with the most steps."""
        with self.lock:
            self._expire()
            for t in [t for t in self.tickets.values() if t.joiner == joiner]:
                self._fail(t, "superseded by a new request")
                del self.tickets[t.id]  # dropped at once: its upload, if any, then fails as expired
            donors = sorted(
                (c for c in candidates if c[0] != joiner and c[2] > 0 and c[1] not in self.bad_donors),
                key=lambda c: -c[2],
            )
            busy = {t.donor_session for t in self.tickets.values() if t.state in ("asked", "uploading")}
            donors = [c for c in donors if c[1] not in busy] or donors
            if not donors:
                return {"ok": False, "reason": "no live learner with inner state to copy from"}
            learner, session, _ = donors[0]
            ticket = Ticket(secrets.token_hex(8), joiner, joiner_session, learner, session, time.monotonic())
            self.tickets[ticket.id] = ticket
            return {"ok": True, "ticket": ticket.id, "donor": learner}

    def due_for(self, session: str) -> str | None:
        """The ticket this session is asked to donate for, if any (sent with its heartbeat reply)."""
        with self.lock:
            for t in self.tickets.values():
                if t.donor_session == session and t.state == "asked":
                    return t.id
        return None

    def begin(self, ticket_id: object, session: str) -> None:
        """The donor's upload started (its first frame arrived); ValueError for a ticket it does not hold."""
        with self.lock:
            t = self._ticket(ticket_id)
            if t is None or t.donor_session != session or t.state != "asked":
                raise ValueError("no open donation ticket of this session")
            t.state = "uploading"

    def expected(self, ticket_id: object, session: str, names: list[str]) -> dict[str, tuple[int, ...]]:
        """The shapes the donor's tensors must have; ValueError for a ticket or name it has no right to."""
        with self.lock:
            t = self._ticket(ticket_id)
            if t is None or t.donor_session != session or t.state != "uploading":
                raise ValueError("no donation of this session in progress")
        keys: dict[str, int] = {}
        expected = {}
        for full in names:
            param, _, key = full.rpartition("/")
            if param not in self.shapes or not KEY.match(key):
                raise ValueError(f"state tensor {full[:80]!r} names no parameter of the model (or a bad key)")
            keys[param] = keys.get(param, 0) + 1
            if keys[param] > MAX_KEYS_PER_PARAM:
                raise ValueError(f"more than {MAX_KEYS_PER_PARAM} state tensors for {param!r}")
            expected[full] = self.shapes[param]
        return expected

    def check_scalars(self, scalars: object) -> dict[str, dict[str, float]]:
        if not isinstance(scalars, dict) or len(scalars) > len(self.shapes):
            raise ValueError("scalars must map parameter names to {key: number}")
        out: dict[str, dict[str, float]] = {}
        for param, values in scalars.items():
            if param not in self.shapes or not isinstance(values, dict) or len(values) > MAX_KEYS_PER_PARAM:
                raise ValueError(f"scalars for {str(param)[:80]!r}: not a parameter of the model")
            for key, v in values.items():
                if (
                    not KEY.match(str(key))
                    or isinstance(v, bool)
                    or not isinstance(v, (int, float))
                    or not -MAX_SCALAR <= v <= MAX_SCALAR
                    or v != v
                ):
                    raise ValueError(f"scalar {param}/{str(key)[:32]} must be a finite number, got {str(v)[:40]}")
            out[param] = {str(k): float(v) for k, v in values.items()}
        return out

    def complete(self, ticket_id: str, tensors: dict[str, torch.Tensor], scalars: dict, checksum: str) -> None:
        with self.lock:
            t = self.tickets.get(ticket_id)
            if t is None or t.state != "uploading":
                raise ValueError("the donation ticket expired or failed meanwhile")
            t.tensors, t.scalars, t.checksum, t.state = tensors, scalars, checksum, "ready"
            t.step = max((v.get("step", 0.0) for v in scalars.values()), default=0.0)
            self.donated += 1

    def fail(self, ticket_id: object, reason: str) -> None:
        with self.lock:
            t = self._ticket(ticket_id)
            if t is not None:
                self._fail(t, reason)

    def poll(self, ticket_id: object, session: str) -> dict:
        with self.lock:
            self._expire()
            t = self._ticket(ticket_id)
            if t is None or t.joiner_session != session:
                return {"ok": True, "state": "failed", "reason": "unknown ticket (expired or never issued)"}
            waiting = t.state in ("asked", "uploading")
        if waiting and not self.alive(t.donor_session):  # outside our lock: `alive` takes the service's
            with self.lock:
                if t.state in ("asked", "uploading"):
                    self._fail(t, f"donor learner {t.donor} is gone")
        with self.lock:
            return {"ok": True, "state": t.state, "reason": t.reason, "donor": t.donor}

    def take(self, ticket_id: object, session: str) -> Ticket:
        """The ready donation, handed over once (its memory is then the joiner's stream's only)."""
        with self.lock:
            t = self._ticket(ticket_id)
            if t is None or t.joiner_session != session or t.state != "ready":
                raise ValueError("no ready donation for this session")
            t.state = "taken"
            del self.tickets[t.id]
            return t

    def poll_state(self, ticket_id: object) -> str | None:
        with self.lock:
            t = self._ticket(ticket_id)
            return t.state if t is not None else None

    def summary(self) -> dict:
        """Counts, and the newest tickets only: Status must stay far below the wire's header limit."""
        with self.lock:
            newest = sorted(self.tickets.values(), key=lambda t: t.created)[-SUMMARY_TICKETS:]
            return {
                "donated": self.donated,
                "failed": self.failed,
                "tickets": len(self.tickets),
                "open": {t.id: {"joiner": t.joiner, "donor": t.donor, "state": t.state} for t in newest},
            }

    def _ticket(self, ticket_id: object) -> Ticket | None:
        """The ticket of an id as a client sent it (any JSON value); the caller holds the lock."""
        return self.tickets.get(ticket_id) if isinstance(ticket_id, str) else None

    def _fail(self, t: Ticket, reason: str) -> None:
        if t.state in ("asked", "uploading", "ready"):
            if t.state != "ready" and reason != "superseded by a new request":
                self.bad_donors.add(t.donor_session)
            t.state, t.reason, t.tensors = "failed", reason, {}
            self.failed += 1

    def _expire(self) -> None:
        now = time.monotonic()
        for t in list(self.tickets.values()):
            if now - t.created > self.ttl:
                self._fail(t, f"no donation within {self.ttl:.0f} s")
                del self.tickets[t.id]
