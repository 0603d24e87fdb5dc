"""The synchronizer service: drives `SynchronizerCore` with real time, sessions and durable state.

Everything that touches the core happens under one lock, because the core is a plain state machine.
A timer thread (`timer`) calls `poll` when a grace window ends (`next_deadline`) and declares
learners gone when their heartbeats stop (`leave`). Actions the core returns are carried out in
order by `dispatch`: a merge is booked and checkpointed *before* its update is queued to the
learners, so a version a learner ever saw is never lost to a crash (with the default
--checkpoint-every 1). Sessions, registration, heartbeats and leaving live in `membership`
(`self.membership`, whose `sessions` this class reads too), the run's end in `budget`; the gRPC
handlers that feed this class live in `handlers`.
"""

from __future__ import annotations

import logging
import math
import os
import threading
import time
from collections import deque
from typing import cast

from ..core import Contribution, Decline, RejectCode, Rejected, SynchronizerCore
from ..core.merge_job import MergeJob, MergeResult
from ..records.events import EventLog
from ..records.ratelimit import RateLimit
from ..wire import framing
from ..wire.headers import Reply
from ..wire.protocol import rejection_action
from . import status, ticks
from .arrivals import Arrivals
from .budget import RunBudget
from .checkpoint import CheckpointStore, Snapshot
from .commit import CommitLog
from .dispatch import ActionDispatcher
from .donations import DonationDesk
from .ledger import MergeLedger, PendingWork
from .membership import Membership
from .merger import MergeWorkers
from .readers import FragmentReaders
from .sessions import Session
from .settings import Refused, ServiceSettings
from .timer import Timer
from .traffic import Traffic

__all__ = ["Refused", "ServiceSettings", "Session", "SynchronizerService"]

log = logging.getLogger(__name__)
# The share of the drain (`Timeouts.drain`) the final flush's rounds may gather in; the rest is for
# their merges and the updates that follow.
FLUSH_SHARE = 0.75


class SynchronizerService:
    dispatcher: ActionDispatcher  # made in __init__ after `membership`, which calls it once learners register
    donations: DonationDesk

    def __init__(
        self,
        core: SynchronizerCore,
        settings: ServiceSettings,
        identity: dict,
        plan_json: dict,
        store: CheckpointStore | None = None,
        events: EventLog | None = None,
    ) -> None:
        self.core = core
        self.settings = settings
        self.identity = identity
        self.plan_json = plan_json
        self.shapes = {n: tuple(s) for n, s in plan_json["shapes"].items()}
        self.store = store
        self.events = events or EventLog(None)
        self.lock = threading.RLock()
        self.cond = threading.Condition(self.lock)
        self.traffic = Traffic()  # bulk bytes in and out (status, run summaries)
        self.arrivals = Arrivals()  # contributions decoded and waiting for the lock, per fragment
        self.t0 = time.monotonic()
        self.ledger = MergeLedger(core.plan, time.time())
        self.membership = Membership(
            core,
            settings,
            plan_json,
            self.events,
            self.cond,
            self.ledger,
            self.arrivals,
            self.traffic,
            self,
            lambda holds: self.dispatcher.held_by(holds),
            lambda session_id: self.donations.due_for(session_id),
        )
        self.sessions = self.membership.sessions
        t = settings.timeouts
        self.donations = DonationDesk(
            self.shapes,
            t.drain + t.bulk(16 * sum(math.prod(v) for v in self.shapes.values())),
            lambda sid: self.membership.session(sid) is not None,
        )
        self.stopping = False
        self.stop_reason = ""
        self.stop_mono = 0.0
        self.stop_wall: float | None = None  # when the stop was decided: the end of the run's window (`summary`)
        self.finished = threading.Event()
        self.closed = False
        # `ServiceSettings` sets workers when it is not given
        self.bulk_slots = threading.BoundedSemaphore(cast(int, settings.workers) - settings.reserved_control_workers)
        self.recent_rejections: deque[str] = deque(maxlen=20)
        self.refused_rpcs = 0
        self._refusal_log = RateLimit(per_second=5.0, burst=20)
        self._rejection_log = RateLimit(per_second=5.0, burst=20)  # refused contributions of sessions
        self.quorum_logged: set[tuple[int, int]] = set()  # rounds whose missing quorum was logged
        self.restored_from: int | None = None
        if store is not None and store.exists():
            manifest = store.load(core, identity)
            self.ledger.load_state_dict(manifest.get("ledger", {}))
            self.restored_from = int(manifest.get("seq", 0))
            log.info("restored checkpoint seq %s: versions %s", self.restored_from, core.versions)
            self.events.write("restored", seq=self.restored_from, versions=core.versions)
        elif store is not None:
            # the manifest exists from the start; nothing serves yet, so the live tensors are written
            store.save(core, identity, self.ledger.state_dict(), copy=False)
        # After the restore: --duration counts from the run's first start, which the checkpoint's ledger
        # holds (a checkpoint without it falls back to this start).
        self.budget = RunBudget(settings.tokens, settings.duration, self.ledger.started_wall)
        self.commit = (
            CommitLog(
                store,
                self.cond,
                self._snapshot,
                dict(core.versions),
                hold=settings.checkpoint_every == 1,
                on_written=self._written,
            )
            if store is not None and settings.checkpoint_every > 0
            else None
        )
        # learners that end the run themselves (no budget, no Stop) begin the same final flush (`core.finishing`)
        core.learners_end.window = FLUSH_SHARE * settings.timeouts.drain
        self.learners_ended = False  # the flush under way is the learners' (logged once: `dispatch`)
        self.merger = MergeWorkers(self._finish_merge, min(len(core.owned), os.cpu_count() or 1))
        self.readers = FragmentReaders()  # fetches sending live fragments (`readers`)
        self.dispatcher = ActionDispatcher(
            core, settings, self.ledger, self.sessions, self.events, self.commit, self.cond, self.merger.submit
        )
        self._timer = Timer(
            self.cond,
            self._tick,
            core.next_deadline,
            self.now,
            lambda: self.closed,
            period=settings.timeouts.heartbeat / 2,
        )

    # --- lifecycle ------------------------------------------------------------------------------
    def start(self) -> None:
        self.events.write(
            "started", shard=self.settings.shard, num_shards=self.settings.num_shards, versions=self.core.versions
        )
        self._timer.start()

    def now(self) -> float:
        return time.monotonic() - self.t0

    def close(self) -> None:
        """Stop the timer, write a final checkpoint, drop every session."""
        with self.cond:
            if self.closed:
                return
            self.closed = True
            self.cond.notify_all()
        self.merger.close()  # merges already due are applied, so the final checkpoint holds them
        if self.commit is not None:
            self.commit.close()
        try:
            with self.cond:
                try:
                    self.checkpoint()
                finally:  # a final checkpoint that fails (a full or vanished disk) still ends every stream
                    for s in self.sessions:
                        self.sessions.close(s)
        finally:
            self._timer.join(timeout=5)
            self.events.write("closed", versions=self.core.versions)

    def checkpoint(self) -> None:
        """A synchronous checkpoint (at the end and on SIGTERM); the caller holds the lock."""
        if self.store is None:
            return
        snap = self._snapshot()
        self.store.write(snap)
        self._written(snap)

    def _snapshot(self) -> Snapshot:
        # Under write-ahead the fragments cannot change while they are written: no copies (see `commit`).
        assert self.store is not None  # only called with a store (`checkpoint`, `commit`)
        return self.store.snapshot(
            self.core, self.identity, self.ledger.state_dict(), copy=self.settings.checkpoint_every != 1
        )

    def _written(self, snap: Snapshot) -> None:
        self.events.write("checkpoint", seq=snap.seq, versions=snap.versions, write_seconds=snap.write_seconds)

    def begin_stop(self, reason: str) -> None:
        with self.cond:
            if self.stopping:
                return
            self.stopping = True
            # the final flush's rounds gather within the drain, so that each one merges before the
            # drain ends (`ticks`) instead of being abandoned with its accepted work (#46)
            self.core.begin_final_flush(ends=self.now() + FLUSH_SHARE * self.settings.timeouts.drain)
            self.stop_reason = reason
            self.stop_mono = time.monotonic()
            self.stop_wall = time.time()
            log.info("stopping: %s", reason)
            self.events.write("stop", reason=reason)
            frame = framing.message({"kind": "stop", "reason": reason})
            for s in self.sessions:
                s.outbox.put_control(frame)
            self.cond.notify_all()

    def progress(self) -> float:
        """The run's progress in [0, 1] (drives the learners' learning-rate schedule)."""
        return self.budget.progress(self.budget_tokens(), time.time())

    def budget_tokens(self) -> float:
        """The tokens the budget counts: trained (reported) or merged, as the settings say."""
        return self.ledger.tokens_merged if self.settings.budget_counts == "merged" else self.ledger.tokens_reported

    # --- contributions --------------------------------------------------------------------------
    def decline(self, session_id: object, fragment: int, version: int, reason: str) -> dict:
        with self.cond:
            s = self.sessions.get(session_id)
            if s is None:
                return Reply.refused(RejectCode.UNKNOWN_SESSION, "unknown session: register again").encode()
            s.last_seen = time.monotonic()
            now = self.now()
            decline = Decline(s.learner, fragment, version, reason)
            self.dispatch(self.core.receive(decline, now, self.arrivals.waiting()), now)
            return Reply().encode()

    def contribute(
        self,
        s: Session,
        c: Contribution,
        work: PendingWork,
        tokens_total: int | None,
        norms: dict[str, float] | None = None,
    ) -> dict:
        """`norms`: `core.measure(c)` when the caller took them already (as they arrived: `handlers.push_norms`)."""
        if norms is None:
            norms = self.core.measure(c)  # the one pass over its values that validation needs, off the lock
        self.arrivals.arrive(c.fragment)
        with self.cond:
            # contributions queued behind this one join its round even when K = 1 is met now
            hold = self.arrivals.enter(c.fragment)
            reply = self._contribute(s, c, work, tokens_total, hold, norms)
            if not hold:  # the last of a queue merges what the others held, even if it was itself refused
                now = self.now()
                self.dispatch(self.core.poll(now), now)
            return reply

    def _contribute(
        self,
        s: Session,
        c: Contribution,
        work: PendingWork,
        tokens_total: int | None,
        hold: bool,
        norms: dict[str, float],
    ) -> dict:
        with self.cond:
            if self.sessions.get(s.id) is not s:
                return self.reject(
                    None, c.fragment, RejectCode.UNKNOWN_SESSION, "unknown session: register again", c.learner
                )
            s.last_seen = time.monotonic()
            s.finishing = s.finishing or work.final
            if work.final:  # its loop is over: its last work is a tail, perhaps the run's end (`core.finishing`)
                self.core.finishing(s.learner, self.now())
            if tokens_total is not None:
                self.ledger.report_tokens(s.learner, s.incarnation, tokens_total)
            key = (c.learner, c.fragment, c.base_version)
            previous = self.ledger.pending.get(key)
            self.ledger.contributed(c.learner, c.fragment, c.base_version, work)
            now = self.now()
            actions = self.core.receive(c, now, hold, norms)
            mine = [a for a in actions if isinstance(a, Rejected) and a.learner == c.learner]
            if mine:
                if not self._sent_again(mine[0].code):
                    self.ledger.tokens_refused += c.tokens * self.core.plan.share(c.fragment)
                if previous is None:
                    self.ledger.forget(*key)
                else:
                    self.ledger.pending[key] = previous
            self.dispatch(actions, now)
            if mine:
                return self.reject(s, c.fragment, mine[0].code, mine[0].reason, c.learner)
            return Reply().encode()

    def _sent_again(self, code: RejectCode) -> bool:
        """Whether refused work is not lost: a duplicate's is booked once already, and with late work
        refused and arrivals re-based, a learner re-bases a stale snapshot's work onto the version it
        missed and sends it again (`LearnerCore._rebase`), so it is booked when that merges."""
        algorithm = self.core.config
        stale_resent = algorithm.late == "refuse" and algorithm.rebases and code is RejectCode.STALE
        return code is RejectCode.DUPLICATE or stale_resent

    def reject(
        self, s: Session | None, fragment: int | None, code: RejectCode, reason: str, learner: int | None = None
    ) -> dict:
        """Count, log and answer a refused contribution; what its code asks (`protocol.rejection_action`)
        is decided by the code alone, and "reset" sends the learner the global value. `reason` is for
        people: the log, the event, the reply's text."""
        action = rejection_action(code)
        reply = Reply.refused(code, reason).encode()
        with self.cond:
            who = learner if learner is not None else (s.learner if s else -1)
            self.ledger.on_rejected(who)
            if who == -1 and self._refusal_log.allow() is None:  # no session: anyone can send these
                return reply
            text = f"learner {who} fragment {fragment}: {reason}"
            self.recent_rejections.append(text)
            # Stale work is an expected, normal outcome of the algorithm; everything else is a warning.
            # Rate-limited: a session (a token holder) pushing refused work in a loop must not flood
            # the log; the event below and the counts keep every one.
            dropped = self._rejection_log.allow()
            if dropped is not None:
                log.log(
                    logging.INFO if action == "none" else logging.WARNING,
                    "rejected contribution from %s (%s, action: %s)%s",
                    text,
                    code.value,
                    action,
                    f"; {dropped} more not logged (rate limit)" if dropped else "",
                )
            self.events.write("rejected", learner=who, fragment=fragment, code=code.value, reason=reason, action=action)
            if action == "reset" and s is not None and fragment in self.core.versions:
                self.dispatcher.send_current(s, fragment)
        return reply

    def refuse_rpc(self, method: str, reason: str) -> None:
        """Book a request refused at the wire level (bad frame, size, auth). Counted always; logged
        rate-limited and cut short, since the caller (perhaps unauthenticated) chooses both texts."""
        method, reason = method[:64], reason[:300]
        with self.lock:
            if method == "Push":
                self.ledger.rejected += 1
            self.refused_rpcs += 1
            self.recent_rejections.append(f"{method}: {reason}")
        dropped = self._refusal_log.allow()
        if dropped is None:
            return
        if dropped:
            log.warning("%d more refused calls were not logged (rate limit)", dropped)
        log.warning("refused %s: %s", method, reason)
        self.events.write("refused", method=method, reason=reason, not_logged_before=dropped)

    def dispatch(self, actions: list, now: float) -> None:
        self.dispatcher.dispatch(actions, now)
        if self.core.learners_end.began != self.learners_ended:  # after every core call: logged once
            self.learners_ended = self.core.learners_end.began
            if self.learners_ended:
                log.info("every live learner finished its loop: the final flush begins")
                self.events.write("final_flush", began=True, reason="every live learner finished its loop")
            elif not self.stopping:  # else a budget or a Stop took it over (its own `stop` event)
                log.info("a learner joined: the final flush ends, the run goes on")
                self.events.write("final_flush", began=False, reason="a learner joined")

    def _finish_merge(self, job: MergeJob, result: MergeResult, seconds: float) -> None:
        """A merge computed by `merger`: apply and send it (in the merge thread)."""
        with self.cond:
            now = self.now()
            if self.readers.reading(job.fragment):  # a fetch still sends this version: step a copy
                self.core.detach_fragment(job.fragment)
            self.dispatch(self.core.finish_merge(job, result, now), now)
            self.core.observe_sync_time(seconds)
            self.dispatch(self.core.poll(now, self.arrivals.waiting()), now)

    # --- the timer's work -----------------------------------------------------------------------
    def _tick(self) -> None:
        ticks.tick(self)

    # --- reads ----------------------------------------------------------------------------------
    def status(self) -> dict:
        with self.lock:
            return status.status(self)
