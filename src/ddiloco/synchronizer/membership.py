"""Who is in the run: a learner's registration, its heartbeats, its leaving, and the bookkeeping of its session.

`SynchronizerService` holds one `Membership`, which owns the run's sessions (`sessions`) and the
learners' token grants (`grants`). What it works on besides belongs to the service and is handed in:
the core, the ledger and the lock (`cond`) everything runs under, and the run's phase (`RunPhase`:
closing, stopping, finished; the clock, the progress, and `dispatch` for the core's actions). The
service's timer (`ticks`) declares gone the learners whose heartbeats stop.
"""

from __future__ import annotations

import logging
import secrets
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any, Protocol

from ..core import RejectCode, SynchronizerCore
from ..records.events import EventLog
from ..wire import framing
from ..wire.headers import Reply
from .arrivals import Arrivals
from .grants import TokenGrants
from .ledger import MergeLedger
from .outbox import Outbox
from .sessions import Session, SessionTable
from .settings import Refused, ServiceSettings
from .streams import MAX_PUSHES_PER_SESSION
from .traffic import Traffic

log = logging.getLogger("ddiloco.synchronizer.service")  # the service's logger, as in `ticks`


class RunPhase(Protocol):
    """Where the run is, as membership reads it (the service): read under `cond`."""

    closed: bool
    stopping: bool
    stop_reason: str
    finished: threading.Event  # the run is over and drained: a learner registering now ends at once

    def now(self) -> float: ...

    def progress(self) -> float: ...

    def dispatch(self, actions: list, now: float) -> None: ...


class Membership:
    """Registration, heartbeats and leaving, over the sessions and token grants it owns."""

    def __init__(
        self,
        core: SynchronizerCore,
        settings: ServiceSettings,
        plan_json: dict[str, Any],
        events: EventLog,
        cond: threading.Condition,
        ledger: MergeLedger,
        arrivals: Arrivals,
        traffic: Traffic,
        run: RunPhase,
        held_by: Callable[[Mapping[str, str]], set[int]],
        donation_due: Callable[[str], str | None],
    ) -> None:
        """`held_by`: the fragments whose initial value a registering learner built itself, from the
        digests it offers (`dispatch.ActionDispatcher.held_by`); `donation_due`: the ticket of the
        inner-state donation a session is asked for, if any (`donations.DonationDesk.due_for`)."""
        self.core, self.settings, self.plan_json, self.events = core, settings, plan_json, events
        self.cond, self.ledger, self.arrivals, self.traffic, self.run = cond, ledger, arrivals, traffic, run
        self.held_by, self.donation_due = held_by, donation_due
        self.sessions = SessionTable()
        # how far each learner may train: a token budget stops the run within a step per learner (`grants`)
        self.grants = TokenGrants(settings.tokens if settings.budget_counts == "trained" else None)

    def register(self, learner: int, incarnation: str, fresh: bool, holds: Mapping[str, str] | None = None) -> dict:
        max_learners = self.settings.max_learners
        if learner < 0:
            raise Refused("INVALID_ARGUMENT", f"unknown learner id {learner}: learner ids are >= 0")
        if learner >= max_learners:
            raise Refused(
                "INVALID_ARGUMENT",
                f"unknown learner id {learner}: this synchronizer accepts ids 0..{max_learners - 1} "
                f"(start it with a larger --max-learners to admit more)",
            )
        run = self.run
        with self.cond:
            if run.closed:
                raise Refused("UNAVAILABLE", "the synchronizer is shutting down")
            now = run.now()
            old = self.sessions.by_learner.get(learner)
            if old is not None:
                # Trust model (docs/runtime.md): whoever holds the token may register any learner id;
                # the newest registration wins. A takeover is never silent.
                log.warning(
                    "learner %d registered again (incarnation %s, was %s): its old session is closed",
                    learner,
                    incarnation,
                    old.incarnation,
                )
                self.events.write("replaced", learner=learner, incarnation=incarnation, previous=old.incarnation)
                self.sessions.close(old)
                if old.incarnation != incarnation and learner in self.core.live:
                    # A restarted process: its predecessor is gone, do not wait for it.
                    run.dispatch(self.core.leave(learner, now, self.arrivals.waiting()), now)
            restarted = self.sessions.restarted(learner, incarnation)
            session = Session(
                secrets.token_hex(8), learner, incarnation, Outbox(self.traffic.update), time.monotonic(), time.time()
            )
            session.holds = self.held_by(holds or {})
            kept = len(session.holds)
            self.sessions.add(session)
            resume = self.ledger.resume_position(learner, self._open_positions(learner))
            self.ledger.book(learner)
            self.ledger.on_join(time.time())
            run.dispatch(self.core.join(learner, now, restarted=restarted), now)
            if run.stopping:
                session.outbox.put_control(framing.message({"kind": "stop", "reason": run.stop_reason}))
            self.events.write(
                "join",
                learner=learner,
                incarnation=incarnation,
                fresh=fresh,
                resume_position=resume,
                versions=self.core.versions,
                kept=kept,
            )
            log.info(
                "learner %d registered (incarnation %s, %s), resumes at data position %d",
                learner,
                incarnation,
                "fresh" if fresh else "reconnect",
                resume,
            )
            return {
                "session": session.id,
                "shard": self.settings.shard,
                "num_shards": self.settings.num_shards,
                "owned": list(self.core.owned),
                "versions": {str(p): v for p, v in self.core.versions.items()},
                # its work we hold unmerged (fragment -> base version): a reconnecting learner keeps
                # waiting for those merges instead of sending the work again (core/taken.py)
                "holding": {str(p): v for p, v in self.core.holding(learner).items()},
                "resume_position": resume,
                "timeouts": self.settings.timeouts.to_dict(),
                "algorithm": self.core.config.to_dict(),
                "plan": self.plan_json,
                "codec_down": self.settings.codec_down,
                "chunk_bytes": self.settings.chunk_bytes,
                "pushes_per_session": MAX_PUSHES_PER_SESSION,
                "max_message_bytes": self.settings.max_message_bytes,
                "stopping": run.stopping,
                "finished": run.finished.is_set(),
                "progress": run.progress(),
                **self._allowed(self.grants.allowed(incarnation)),
            }

    def _open_positions(self, learner: int) -> list[int]:
        out = []
        for r in self.core.open_rounds():
            if learner in r.contributors:
                info = self.ledger.pending.get((learner, r.fragment, r.version))
                if info is not None:
                    out.append(info.position)
        return out

    def session(self, session_id: object) -> Session | None:
        with self.cond:
            return self.sessions.get(session_id)

    def heartbeat(self, session_id: object, progress: dict) -> dict:
        """Answered without waiting for the service lock, so a learner is never declared gone because
        the synchronizer was busy: the session's clock and progress are plain assignments; its token
        count is booked now if the lock is free, else by the next tick (`book_tokens`)."""
        s = self.sessions.get(session_id)  # one dict read
        if s is None:
            return Reply.refused(
                RejectCode.UNKNOWN_SESSION,
                "unknown session: the synchronizer restarted or declared this learner gone; register again",
            ).encode()
        s.last_seen = time.monotonic()
        s.progress = {
            k: progress[k]
            for k in ("step", "tokens", "position", "step_time", "state", "loss", "overlap", "link_seconds")
            if k in progress
        }
        allowed = self.grants.allowed(s.incarnation)
        if isinstance(progress.get("tokens"), int):
            s.unbooked_tokens = progress["tokens"]
            if self.cond.acquire(blocking=False):
                try:
                    self.book_tokens(s)
                    allowed = self.grant_tokens(s)
                finally:
                    self.cond.release()
        reply: dict[str, object] = {"ok": True, "stopping": self.run.stopping, "progress": self.run.progress()}
        reply.update(self._allowed(allowed))
        ticket = self.donation_due(s.id)
        if ticket is not None:
            reply["donate"] = ticket
        return reply

    def grant_tokens(self, s: Session) -> int | None:
        """Top up the learner's token grant after its report (caller holds the lock; `grants`): at its
        heartbeat when the lock is free, else at the next tick (the reply after it carries it)."""
        if self.sessions.get(s.id) is not s:
            return self.grants.allowed(s.incarnation)
        return self.grants.grant(
            s.incarnation,
            int(s.progress.get("tokens", 0)),
            self.ledger.tokens_reported,
            int(s.progress.get("step", 0)),
            float(s.progress.get("step_time", 0.0)),
            self.settings.timeouts.heartbeat,
            {x.incarnation for x in self.sessions},
        )

    @staticmethod
    def _allowed(allowed: int | None) -> dict[str, int]:
        """The reply's `allowed` field: the tokens the learner may train up to (absent: no limit)."""
        return {} if allowed is None else {"allowed": allowed}

    def book_tokens(self, s: Session) -> None:
        """Book a heartbeat's token count (caller holds the lock)."""
        tokens, s.unbooked_tokens = s.unbooked_tokens, None
        if tokens is not None and self.sessions.get(s.id) is s:
            self.ledger.report_tokens(s.learner, s.incarnation, tokens)

    def donor_candidates(self) -> list[tuple[int, str, float]]:
        """(learner, session, steps) of every live learner that is training: who could donate inner state."""
        with self.cond:
            return [
                (s.learner, s.id, float(s.progress.get("step", 0) or 0))
                for s in self.sessions
                if s.progress.get("state") == "training"
            ]

    def leave(self, session_id: object, tokens: int | None, finished: bool = False) -> dict:
        """`finished`: it leaves because its training loop is over (`LearnerClient.finish`), not on an
        error: the last learners leaving so end the run (`core.finishing`)."""
        with self.cond:
            s = self.sessions.get(session_id)
            if s is None:
                return Reply.refused(RejectCode.UNKNOWN_SESSION, "unknown session").encode()
            if tokens is not None:
                self.ledger.report_tokens(s.learner, s.incarnation, tokens)
            self.sessions.close(s)
            now = self.run.now()
            if finished:
                self.core.finishing(s.learner, now)
            self.events.write(
                "leave", learner=s.learner, incarnation=s.incarnation, reason="finished" if finished else "left"
            )
            log.info("learner %d left%s", s.learner, " (finished)" if finished else "")
            self.run.dispatch(self.core.leave(s.learner, now, self.arrivals.waiting()), now)
            return {"ok": True}
