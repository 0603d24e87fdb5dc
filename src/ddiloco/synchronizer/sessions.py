"""Learner sessions: one per registered learner process, found by session id or by learner id.

A learner id has at most one live session: a process that registers again (a restart, or a
reconnect after a network cut) replaces its old session, whose outbox is closed so that its
Subscribe stream ends.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field

from .outbox import Outbox


@dataclass
class Session:
    id: str
    learner: int
    incarnation: str
    outbox: Outbox
    last_seen: float  # time.monotonic() of the last message from this session
    registered_wall: float
    progress: dict = field(default_factory=dict)
    unbooked_tokens: int | None = None  # from a heartbeat answered while the service was busy
    holds: set[int] = field(default_factory=set)  # fragments whose initial value it built itself
    finishing: bool = False  # it sent its final work: merges of that work go down as notices, without values


class SessionTable:
    """Not thread-safe: the service calls it under its lock."""

    def __init__(self) -> None:
        self._by_id: dict[str, Session] = {}
        self.by_learner: dict[int, Session] = {}
        self.incarnations: dict[int, str] = {}  # learner -> the incarnation it last registered with

    def add(self, session: Session) -> None:
        self._by_id[session.id] = session
        self.by_learner[session.learner] = session
        self.incarnations[session.learner] = session.incarnation

    def restarted(self, learner: int, incarnation: str) -> bool:
        """Whether a registration comes from a new process (not the one that registered last)."""
        return self.incarnations.get(learner) != incarnation

    def get(self, session_id: object) -> Session | None:
        """The session of an id as a client sent it (any JSON value); None if it is not one of ours."""
        return self._by_id.get(session_id) if isinstance(session_id, str) else None

    def __getitem__(self, session_id: str) -> Session:
        return self._by_id[session_id]

    def close(self, session: Session) -> None:
        session.outbox.close()
        self._by_id.pop(session.id, None)
        if self.by_learner.get(session.learner) is session:
            del self.by_learner[session.learner]

    def __iter__(self) -> Iterator[Session]:
        return iter(list(self._by_id.values()))

    def __len__(self) -> int:
        return len(self._by_id)
