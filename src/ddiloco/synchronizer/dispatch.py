"""Carrying out the synchronizer core's actions: book a merge, queue updates, ask for fragments.

Order matters for durability: a merge is booked (and a checkpoint requested) before its update is
queued, and an update leaves a learner's outbox only once the commit log says its version is on
disk (`commit`), so no learner ever holds a version that a crash could lose. A fresh learner that
built a fragment's initial value itself gets a one-line "you hold it" instead (`wire.digest`).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Mapping

from ..core import FragmentRequest, FragmentUpdate, Merged, SynchronizerCore
from ..core.merge_job import MergeDue, MergeJob
from ..records.events import EventLog
from ..wire import framing
from ..wire.delta import DELTA_CODECS
from ..wire.digest import value_digests
from .commit import CommitLog
from .downlink import DeltaDownlink, Encoded
from .ledger import MergeLedger
from .sessions import Session, SessionTable
from .settings import ServiceSettings

SHARE_SECONDS = 10.0  # how long a join's encoded update is kept for the next learner that joins


class ActionDispatcher:
    """Not thread-safe: called under the service's lock (`cond`), which it notifies."""

    def __init__(
        self,
        core: SynchronizerCore,
        settings: ServiceSettings,
        ledger: MergeLedger,
        sessions: SessionTable,
        events: EventLog,
        commit: CommitLog | None,
        cond: threading.Condition,
        submit_merge: Callable[[MergeJob], None],
    ) -> None:
        self.core = core
        self.settings = settings
        self.ledger = ledger
        self.sessions = sessions
        self.events = events
        self.commit = commit
        self.cond = cond
        self.submit_merge = submit_merge  # a MergeDue's job is computed off the lock (`merger`)
        self._merges_since_checkpoint = 0
        self._last_merged: dict[str, int | None] = {}  # learner -> data position, sent with the next update
        self._due: dict[tuple[int, int], float] = {}  # (fragment, new version) -> when its round closed
        # fragment -> (version, when, frames): a join's or a reply's update, encoded once and shared by every
        # learner that asks for the same version soon after (a restart's rejoin wave), then dropped
        self._encoded: dict[int, tuple[int, float, list[bytes] | Encoded]] = {}
        self.initial = {
            p: value_digests({n: core.params[n] for n in core.plan.names[p]})
            for p in core.owned
            if core.versions[p] == 0
        }  # what a fresh learner may hold already
        down = settings.codec_down
        self.downlink = DeltaDownlink(down, settings.chunk_bytes) if down in DELTA_CODECS else None

    def dispatch(self, actions: list, now: float) -> None:
        for a in actions:
            if isinstance(a, MergeDue):
                self._due[(a.job.fragment, a.job.version + 1)] = time.perf_counter()
                self.submit_merge(a.job)
            elif isinstance(a, Merged):
                self._merged(a)
            elif isinstance(a, FragmentUpdate):
                self._update(a)
            elif isinstance(a, FragmentRequest):
                frame = framing.message({"kind": "request", "fragment": a.fragment, "version": a.version})
                for m in a.learners:
                    s = self.sessions.by_learner.get(m)
                    if s is not None:
                        s.outbox.put_control(frame)
        self.cond.notify_all()

    def _update(self, a: FragmentUpdate) -> None:
        merged, self._last_merged = self._last_merged, {}  # whose work made this version: told with it only
        built: list[Session]
        leaving: list[Session]
        others: list[Session]
        built, leaving, others = [], [], []  # built this initial value themselves; merged final work; the rest
        for s in (self.sessions.by_learner.get(m) for m in a.learners):
            if s is None:
                continue
            if a.version == 0 and a.fragment in s.holds:
                built.append(s)
            else:
                (leaving if s.finishing and str(s.learner) in merged else others).append(s)
        if leaving:  # told that their final work went in, without the values a leaving learner would not use
            notice = framing.message({"kind": "merged", "fragment": a.fragment, "version": a.version, "merged": merged})
            for s in leaving:
                self._deliver(a.fragment, a.version, lambda s=s: s.outbox.put_control(notice))  # type: ignore[misc]  # mypy cannot type a lambda with defaults (python/mypy#15459)
        for s in built:
            s.holds.discard(a.fragment)
            self.send_update(
                s,
                a.fragment,
                0,
                [framing.message({"kind": "update", "fragment": a.fragment, "version": 0, "merged": {}, "held": True})],
            )
        if others or self.downlink is not None:  # encoded only if someone needs it (or the shadow starts)
            frames = self._frames(a, merged)
            for s in others:
                self.send_update(s, a.fragment, a.version, frames)
        due = self._due.pop((a.fragment, a.version), None)
        if due is not None:  # after the sends: the round's time until its update is queued
            merged_seconds = time.perf_counter() - due
            self._deliver(
                a.fragment,
                a.version,
                lambda: self.events.write(
                    "sent",
                    fragment=a.fragment,
                    version=a.version,
                    merged_seconds=merged_seconds,
                    round_seconds=time.perf_counter() - due,
                ),
            )

    def _frames(self, a: FragmentUpdate, merged: dict[str, int | None]) -> list[bytes] | Encoded:
        """The update's frames. One that follows no merge (a join, a reply to stale work) is the
        fragment's current value: it is encoded once per version and shared while it is fresh."""
        cached = self._encoded.get(a.fragment)
        if not merged and cached is not None and cached[0] == a.version:
            return cached[2]
        head = {"kind": "update", "fragment": a.fragment, "version": a.version, "merged": merged}
        if a.merged is not None:  # who the merge took: a re-basing learner left out keeps its work
            head["admitted"] = list(a.merged)
        frames = self._encode(head, a.fragment, a.version, a.tensors)
        if merged:
            self._encoded.pop(a.fragment, None)
        else:
            self._encoded[a.fragment] = (a.version, time.monotonic(), frames)
        return frames

    def held_by(self, holds: Mapping[str, str]) -> set[int]:
        """The fragments still at version 0 whose every tensor a learner offered with our digest."""
        return {
            p
            for p, digests in self.initial.items()
            if self.core.versions[p] == 0 and all(holds.get(n) == d for n, d in digests.items())
        }

    def forget_encoded(self, older_than: float = SHARE_SECONDS) -> None:
        """Drop shared encodings older than `older_than` seconds (the timer calls this): once every
        outbox has sent them, only this cache would keep them in memory."""
        now = time.monotonic()
        for p in [p for p, (_, when, _) in self._encoded.items() if now - when > older_than]:
            del self._encoded[p]

    def _merged(self, a: Merged) -> None:
        records = self.ledger.on_merge(a, time.time())
        self._last_merged = {str(r["learner"]): r.get("position") for r in records}
        self._merges_since_checkpoint += 1
        if self.commit is not None and self._merges_since_checkpoint >= self.settings.checkpoint_every:
            self._merges_since_checkpoint = 0
            self.commit.request()
        self.events.write(
            "merge",
            fragment=a.fragment,
            version=a.version,
            learners=[r["learner"] for r in records],
            expected=a.expected,
            quorum_seconds=a.quorum_time,
            grace_seconds=a.grace,
            admitted=records,
        )

    def _encode(self, head: dict, fragment: int, version: int, tensors) -> list[bytes] | Encoded:
        if self.downlink is not None:
            return self.downlink.encode(head, fragment, version, tensors)
        return framing.tensor_frames(head, tensors, self.settings.codec_down, self.settings.chunk_bytes)

    def send_update(self, s: Session, fragment: int, version: float, frames: list[bytes] | Encoded) -> None:
        """Queue an update once its version is durable (see `commit`)."""
        self._deliver(fragment, version, lambda: s.outbox.put_update(fragment, version, frames))

    def _deliver(self, fragment: int, version: float, send: Callable[[], None]) -> None:
        if self.commit is None:
            send()
        else:
            self.commit.deliver(fragment, int(version), send)

    def send_current(self, s: Session, fragment: int) -> None:
        """Send the learner the fragment's current global value, to overwrite its own (a "reset")."""
        update = self.core.current_update(fragment, (s.learner,))
        head = {"kind": "update", "fragment": fragment, "version": update.version, "force": True}
        self.send_update(
            s, fragment, update.version + 0.5, self._encode(head, fragment, update.version, update.tensors)
        )
