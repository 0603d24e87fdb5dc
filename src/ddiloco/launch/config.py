"""What one `ddiloco run` is: the algorithm, model and data flags of `ddiloco sim`, the run's budget,
the runtime's knobs and the faults to inject; and the command lines of its processes."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from ..chaos.injector import ChaosSettings
from ..core import methods
from ..core.config import AlgorithmConfig
from ..learner.ending import DEFAULT_ORPHAN_TIMEOUT
from ..wire.framing import DEFAULT_CHUNK_BYTES
from ..wire.timeouts import Timeouts

_D = AlgorithmConfig()  # the algorithm's defaults live there, once

#: The algorithm's settings a run's synchronizers get as they are: each is the `AlgorithmConfig` field
#: and the `ddiloco synchronizer` flag of its name (fragments, overlap and merge are passed on their own).
SYNCHRONIZER_KNOBS = (
    "late",
    "max_staleness",
    "staleness_discount",
    "quorum",
    "grace",
    "outer_lr",
    "outer_momentum",
    "arrival",
    "final_momentum",
    "ema",
    "max_outer_norm_ratio",
    "outer_debias",
    "outer_restart_every",
    "outer_lr_per_learner",
)


def _flag(name: str, value: object) -> list[str]:
    """A setting as the command line says it: --name VALUE, or --name / --no-name for a switch."""
    flag = name.replace("_", "-")
    if isinstance(value, bool):
        return [f"--{flag}" if value else f"--no-{flag}"]
    return [f"--{flag}", str(value)]


@dataclass(frozen=True)
class RunConfig:
    run_dir: Path
    method: str = "decoupled"
    model: str = "gpt"
    model_size: str = "default"
    data: str | None = None
    seq_len: int = 128
    learners: int = 4
    fragments: int = _D.fragments
    sync_every: int = _D.sync_every
    overlap: int = _D.overlap
    overlap_auto: bool = True  # --overlap auto: each learner widens tau by its link's steps (`learner.overlap`)
    late: str = _D.late
    max_staleness: int = _D.max_staleness
    staleness_discount: float = _D.staleness_discount
    quorum: int = _D.quorum
    grace: float = _D.grace
    merge: str | None = None
    outer_lr: float = _D.outer_lr
    outer_momentum: float = _D.outer_momentum
    arrival: str = _D.arrival
    final_momentum: bool = _D.final_momentum
    ema: float = _D.ema
    max_outer_norm_ratio: float = _D.max_outer_norm_ratio
    outer_debias: bool = _D.outer_debias
    outer_restart_every: int = _D.outer_restart_every
    outer_lr_per_learner: float = _D.outer_lr_per_learner
    inner_lr: float = 3e-3
    batch_size: int = 16
    seed: int = 0
    tokens: int | None = None
    duration: float | None = None
    sync_shards: int = 1
    codec: str = "bf16"
    codec_down: str = "bf16"
    bulk_socket: bool = True  # pushes on the synchronizers' plain TCP bulk plane (`wire.sockets`), not gRPC
    wan: tuple[float, float, float] = (0.0, 0.0, 0.0)  # emulated link: latency ms, MB/s, jitter ms
    heartbeat: float = 0.5
    min_bandwidth: float | None = None  # MB/s the bulk deadlines assume; None: `bulk_min_bandwidth`
    checkpoint_every: int = 1
    threads: int = 1
    eval_batches: int = 20
    eval_every: float = 0.0
    min_step_seconds: float = 0.0
    token: str | None = None
    peer_recovery: bool = True
    orphan_timeout: float = DEFAULT_ORPHAN_TIMEOUT  # a learner alone this long ends (`learner.ending`)
    sync_hosts: tuple[str, ...] = ()  # the address each shard listens on (--network hosts); none: 127.0.0.1
    chaos: ChaosSettings = field(default_factory=ChaosSettings)

    def __post_init__(self) -> None:
        if self.method not in methods.DILOCO_METHODS:
            raise ValueError(f"ddiloco run supports --method {', '.join(methods.DILOCO_METHODS)}, got {self.method!r}")
        if self.tokens is None and self.duration is None:
            raise ValueError("give --tokens N or --duration S (or both): the run needs a budget")
        if self.learners < 1 or self.sync_shards < 1:
            raise ValueError("need at least one learner and one synchronizer shard")
        if self.tokens is not None and self.tokens < 1 or self.duration is not None and self.duration <= 0:
            raise ValueError("--tokens and --duration must be positive")

    @property
    def bulk_min_bandwidth(self) -> float | None:
        """MB/s the synchronizers' push and fetch deadlines assume: the flag, else half the emulated
        link's rate (a whole-model push on a slow link must not outlive a deadline sized for 10 MB/s)."""
        if self.min_bandwidth is not None:
            return self.min_bandwidth
        return max(0.001, min(10.0, self.wan[1] / 2)) if self.wan[1] > 0 else None

    @property
    def link_chunk_bytes(self) -> int | None:
        """Wire chunk that crosses the emulated link in a quarter of the failure timeout. The emulation
        holds a whole chunk back until its bytes are paid for, where a real link trickles them; a 1 MiB
        chunk on a slow link would leave the stream silent past the synchronizer's idle limit."""
        if not self.wan[1] > 0:
            return None
        fitting = int(self.wan[1] * 1e6 * Timeouts.derive(self.heartbeat).failure / 4) // 16 * 16
        return min(DEFAULT_CHUNK_BYTES, max(4096, fitting))

    @property
    def horizon(self) -> float:
        """How far ahead faults are drawn: the duration, or a generous bound for token budgets."""
        return self.duration if self.duration is not None else 24 * 3600.0

    def sync_dir(self, shard: int) -> Path:
        return self.run_dir / f"sync-{shard}"

    def learner_dir(self, m: int) -> Path:
        return self.run_dir / f"learner-{m}"

    def _model_args(self) -> list[str]:
        args = [
            "--model",
            self.model,
            "--model-size",
            self.model_size,
            "--seq-len",
            str(self.seq_len),
            "--seed",
            str(self.seed),
            "--learners",
            str(self.learners),
        ]
        if self.data is not None:
            args += ["--data", self.data]
        return args

    def synchronizer_args(self, shard: int, port: int) -> list[str]:
        d = self.sync_dir(shard)
        args = [
            "synchronizer",
            "--host",
            self.sync_hosts[shard] if self.sync_hosts else "127.0.0.1",
            "--port",
            str(port),
            "--address-file",
            str(d / "address"),
            *self._model_args(),
            "--method",
            self.method,
            "--fragments",
            str(self.fragments),
            "--sync-every",
            str(self.sync_every),
            "--overlap",
            "auto" if self.overlap_auto else str(self.overlap),
            *(arg for name in SYNCHRONIZER_KNOBS for arg in _flag(name, getattr(self, name))),
            "--shard",
            str(shard),
            "--num-shards",
            str(self.sync_shards),
            "--max-learners",
            str(self.learners),
            "--checkpoint-dir",
            str(d),
            "--checkpoint-every",
            str(self.checkpoint_every),
            "--threads",
            str(self.threads),
            "--heartbeat",
            str(self.heartbeat),
            "--event-log",
            str(d / "events.jsonl"),
            "--summary",
            str(d / "summary.json"),
            "--codec-down",
            self.codec_down,
        ]
        if self.merge:
            args += ["--merge", self.merge]
        if not self.bulk_socket:
            args += ["--no-bulk-socket"]
        if self.tokens is not None:
            args += ["--tokens", str(self.tokens)]
        if self.duration is not None:
            args += ["--duration", str(self.duration)]
        if self.bulk_min_bandwidth is not None:
            args += ["--min-bandwidth", str(self.bulk_min_bandwidth)]
        if self.link_chunk_bytes is not None:
            args += ["--chunk-bytes", str(self.link_chunk_bytes)]
        return args

    def learner_args(self, m: int, addresses: list[str]) -> list[str]:
        args = [
            "learner",
            "--connect",
            ",".join(addresses),
            "--id",
            str(m),
            *self._model_args(),
            "--batch-size",
            str(self.batch_size),
            "--inner-lr",
            str(self.inner_lr),
            "--codec",
            self.codec,
            "--state-dir",
            str(self.learner_dir(m)),
            "--threads",
            str(self.threads),
            "--save-state-every",
            str(self.sync_every),
            "--orphan-timeout",
            f"{self.orphan_timeout:g}",
        ]
        if self.min_step_seconds > 0:
            args += ["--min-step-seconds", str(self.min_step_seconds)]
        if not self.peer_recovery:
            args.append("--no-peer-recovery")
        if self.chaos.net_delay_ms:
            args += ["--net-delay", str(self.chaos.net_delay_ms)]
        for flag, value in zip(("--net-latency", "--net-bandwidth", "--net-jitter"), self.wan, strict=True):
            if value:
                args += [flag, str(value)]
        return args

    def as_dict(self) -> dict:
        """The settings the run's synchronizers use: what the user asked, then what the method sets
        (`core.methods`)."""
        fixed = methods.fixed_knobs(self.method, self.learners)
        overlap = "auto" if self.overlap_auto else self.overlap
        return {
            "method": self.method,
            "model": self.model,
            "learners": self.learners,
            "seed": self.seed,
            "fragments": fixed.get("fragments", self.fragments),
            "sync_every": self.sync_every,
            "overlap": fixed.get("overlap", overlap),
            "late": self.late,
            "quorum": fixed.get("quorum", self.quorum),
            "grace": fixed.get("grace", self.grace),
            "merge": self.merge or methods.default_merge(self.method),
        }
