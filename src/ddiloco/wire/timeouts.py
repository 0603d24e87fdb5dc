"""The one set of timeouts of the networked runtime, derived from the heartbeat interval.

    heartbeat   h                      learner -> synchronizer, on the control channel
    failure     6 h                    a learner silent this long is declared gone (leave)
    rpc         2 h                    deadline of a control RPC (register, heartbeat, decline, leave)
    bulk rpc    rpc + bytes / min_bw   deadline of a push or a fetch, growing with the size
    stream idle failure                the synchronizer cancels a bulk stream silent this long
    stream max  bulk rpc + failure     ... or open this long (synchronizer/streams.py)
    backoff     h / 5 .. failure / 2   reconnect backoff, doubling, with jitter
    drain       4 failure              how long the end of a run waits for the last merges

Why these ratios: a learner is only declared gone after several heartbeats in a row went missing
(so one slow RPC or a GC pause is not a failure); an RPC never outlives the failure timeout (so a
stuck call cannot hide a dead peer); reconnect attempts are frequent enough that a restarted
synchronizer sees its learners again well within one failure timeout. Override any of them, and
`validate` refuses combinations that break these orderings. The synchronizer sends its timeouts to
every learner at registration, so both sides always use the same set.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass, replace
from typing import Any


@dataclass(frozen=True)
class Timeouts:
    heartbeat: float = 0.5
    failure: float = 3.0
    rpc: float = 1.0
    backoff_min: float = 0.1
    backoff_max: float = 1.5
    drain: float = 12.0
    min_bandwidth: float = 10e6  # bytes/s assumed for bulk deadlines

    @classmethod
    def derive(cls, heartbeat: float = 0.5, **overrides: float) -> Timeouts:
        """The defaults scaled from one heartbeat interval; keyword arguments override single values."""
        failure = overrides.pop("failure", 6 * heartbeat)
        t = cls(
            heartbeat=heartbeat,
            failure=failure,
            rpc=2 * heartbeat,
            backoff_min=heartbeat / 5,
            backoff_max=failure / 2,
            drain=4 * failure,
        )
        t = replace(t, **overrides)
        t.validate()
        return t

    def validate(self) -> None:
        problems = []
        if not self.heartbeat > 0:
            problems.append(f"heartbeat must be > 0, got {self.heartbeat}")
        if not self.failure >= 3 * self.heartbeat:
            problems.append(f"failure ({self.failure}) must be >= 3 x heartbeat ({self.heartbeat})")
        if not self.heartbeat <= self.rpc < self.failure:
            problems.append(f"rpc deadline ({self.rpc}) must be in [heartbeat, failure)")
        if not 0 < self.backoff_min <= self.backoff_max <= self.failure:
            problems.append("need 0 < backoff_min <= backoff_max <= failure")
        if not self.drain >= self.failure:
            problems.append(f"drain ({self.drain}) must be >= failure ({self.failure})")
        if not self.min_bandwidth > 0:
            problems.append("min_bandwidth must be > 0")
        if problems:
            raise ValueError("invalid timeouts: " + "; ".join(problems))

    def bulk(self, nbytes: int) -> float:
        """Deadline of a bulk RPC moving nbytes."""
        return self.rpc + nbytes / self.min_bandwidth

    def to_dict(self) -> dict[str, float]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> Timeouts:
        t = cls(**{k: float(v) for k, v in d.items() if k in cls.__dataclass_fields__})
        t.validate()
        return t
