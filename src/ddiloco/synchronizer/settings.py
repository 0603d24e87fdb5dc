"""The synchronizer service's settings, and the refusal a request meets before it reaches the core."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import cast

from ..wire import framing
from ..wire.timeouts import Timeouts

BUDGET_COUNTS = ("trained", "merged")
CODECS_DOWN = ("bf16", "fp32", "int8", "int4")  # int8 / int4: differences from what a learner holds (`downlink`)


@dataclass(frozen=True)
class ServiceSettings:
    shard: int = 0
    num_shards: int = 1
    max_learners: int = 64  # learner ids must be below this: bounds what the service keeps per learner
    codec_down: str = "bf16"  # codec of the global fragments sent to learners (the master copy stays fp32)
    chunk_bytes: int = framing.DEFAULT_CHUNK_BYTES
    max_message_bytes: int = 1 << 30
    checkpoint_every: int = 1  # merges between checkpoints; 0: only at the end and on SIGTERM
    tokens: int | None = None  # stop once the learners report this many tokens (see budget_counts)
    budget_counts: str = "trained"  # "trained": every token a learner trained; "merged": only those merged
    keep_versions: int = 2  # fragment versions a checkpoint keeps on disk
    duration: float | None = None  # stop this many seconds after the run's first start (kept in the checkpoint)
    timeouts: Timeouts = field(default_factory=Timeouts)
    workers: int | None = None  # gRPC threads; default 6 per admissible learner + 16 (see `streams`)
    reserved_control_workers: int = 8
    # The gRPC port's connections before their first bytes (`grpc_front`): at most this many at once
    # (and always below the descriptor limit), this many from one address, each for this many seconds.
    grpc_waiting: int = 256
    grpc_waiting_per_address: int = 32
    grpc_preface_seconds: float = 5.0

    def __post_init__(self) -> None:
        if self.checkpoint_every < 0:
            raise ValueError("checkpoint_every must be >= 0")
        if self.codec_down not in CODECS_DOWN:
            raise ValueError(f"codec_down must be one of {CODECS_DOWN}, got {self.codec_down!r}")
        if self.budget_counts not in BUDGET_COUNTS:
            raise ValueError(f"budget_counts must be one of {BUDGET_COUNTS}, got {self.budget_counts!r}")
        if not 1 <= self.keep_versions <= 1000:
            raise ValueError(f"keep_versions must be in [1, 1000], got {self.keep_versions}")
        if self.workers is None:
            # A session holds at most one Subscribe, 4 pushes (`streams.MAX_PUSHES_PER_SESSION`) and a
            # fetch: 6 per learner, and 16 more, so that every learner's streams fit at once.
            object.__setattr__(self, "workers", 6 * self.max_learners + 16)
        if cast(int, self.workers) <= self.reserved_control_workers:  # set just above if it was None
            raise ValueError("workers must exceed reserved_control_workers")
        if not 1 <= self.max_learners <= 2**20:
            raise ValueError(f"max_learners must be in [1, {2**20}], got {self.max_learners}")
        if self.grpc_waiting < 1 or self.grpc_waiting_per_address < 1 or not 0 < self.grpc_preface_seconds <= 600:
            raise ValueError("grpc_waiting and grpc_waiting_per_address must be >= 1, grpc_preface_seconds in (0, 600]")
        self.timeouts.validate()


class Refused(Exception):
    """A request refused before it reached the core; `code` names the gRPC status to answer."""

    def __init__(self, code: str, reason: str) -> None:
        super().__init__(reason)
        self.code = code
        self.reason = reason
