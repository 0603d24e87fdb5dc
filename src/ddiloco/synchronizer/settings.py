"""The synchronizer service's settings, and the refusal a request meets before it reaches the core."""

from __future__ import annotations

from dataclasses import dataclass, field

from ..wire import framing
from ..wire.timeouts import Timeouts


@dataclass(frozen=True)
class ServiceSettings:
    shard: int = 0
    num_shards: int = 1
    max_learners: int | None = None  # learner ids must be below this; None accepts any id >= 0
    codec_down: str = "fp32"  # codec of the global fragments sent to learners
    chunk_bytes: int = framing.DEFAULT_CHUNK_BYTES
    max_message_bytes: int = 1 << 30
    checkpoint_every: int = 1  # merges between checkpoints; 0: only at the end and on SIGTERM
    tokens: int | None = None  # stop once the learners report this many trained tokens
    duration: float | None = None  # stop this many seconds after start
    timeouts: Timeouts = field(default_factory=Timeouts)
    workers: int = 64
    reserved_control_workers: int = 8

    def __post_init__(self) -> None:
        if self.checkpoint_every < 0:
            raise ValueError("checkpoint_every must be >= 0")
        if self.workers <= self.reserved_control_workers:
            raise ValueError("workers must exceed reserved_control_workers")
        if self.max_learners is not None and self.max_learners < 1:
            raise ValueError("max_learners must be >= 1")
        self.timeouts.validate()


class Refused(Exception):
    """A request refused before it reached the core; `code` names the gRPC status to answer."""

    def __init__(self, code: str, reason: str) -> None:
        super().__init__(reason)
        self.code = code
        self.reason = reason
