"""What one `ddiloco run` is: the algorithm, model and data flags of `ddiloco sim`, the run's budget,
the runtime's knobs and the faults to inject; and the command lines of its processes."""

from __future__ import annotations

import json
from dataclasses import dataclass, field, fields
from pathlib import Path

from ..chaos.injector import ChaosSettings
from ..core import methods
from ..core.config import AlgorithmConfig
from ..learner.ending import DEFAULT_ORPHAN_TIMEOUT
from ..learner.wan import LinkConfig
from ..records.atomic import atomic_write
from ..train.inner import InnerConfig
from ..train.streams import SHARD_LAYOUTS, check_shard_layout
from ..wire.framing import DEFAULT_CHUNK_BYTES
from ..wire.timeouts import Timeouts


@dataclass(frozen=True)
class NetworkConfig:
    """How a run's processes reach each other: the emulated link, the codecs on it, the bulk plane and
    where the shards listen."""

    link: LinkConfig = field(default_factory=LinkConfig)  # the learners' emulated wide-area link
    codec: str = "bf16"  # outer gradients up
    codec_down: str = "bf16"  # merged fragments down
    bulk_socket: bool = True  # pushes on the synchronizers' plain TCP bulk plane (`wire.sockets`), not gRPC
    min_bandwidth: float | None = None  # MB/s the bulk deadlines assume; None: `RunConfig.bulk_min_bandwidth`
    sync_hosts: tuple[str, ...] = ()  # the address each shard listens on (--network hosts); none: 127.0.0.1


@dataclass(frozen=True)
class RunConfig:
    """One run's settings as a tree: the algorithm its synchronizers run (`core.config`), the inner
    optimizer its learners build (`train.inner`), the network, the faults (`chaos`), and the run's own
    (model, budget, processes). `algorithm` is what the synchronizers build: `RunConfig` applies what
    `method` fixes (`core.methods.algorithm_for`)."""

    run_dir: Path
    method: str = "decoupled"
    model: str = "gpt"
    model_size: str = "default"
    data: str | None = None
    seq_len: int = 128
    shard_layout: str = SHARD_LAYOUTS[0]  # how the text is dealt to the learners (`train.streams`)
    learners: int = 4
    algorithm: AlgorithmConfig = field(default_factory=AlgorithmConfig)
    overlap_auto: bool = True  # --overlap auto: each learner widens tau by its link's steps (`learner.overlap`)
    inner: InnerConfig = field(default_factory=InnerConfig)  # each learner's inner optimizer (`train.inner`)
    seed: int = 0
    tokens: int | None = None
    duration: float | None = None
    sync_shards: int = 1
    network: NetworkConfig = field(default_factory=NetworkConfig)
    heartbeat: float = 0.5
    checkpoint_every: int = 1
    threads: int = 1
    eval_batches: int = 20
    eval_every: float = 0.0
    min_step_seconds: float = 0.0
    token: str | None = None
    peer_recovery: bool = True
    orphan_timeout: float = DEFAULT_ORPHAN_TIMEOUT  # a learner alone this long ends (`learner.ending`)
    chaos: ChaosSettings = field(default_factory=ChaosSettings)

    def __post_init__(self) -> None:
        check_shard_layout(self.shard_layout)
        if self.method not in methods.DILOCO_METHODS:
            raise ValueError(f"ddiloco run supports --method {', '.join(methods.DILOCO_METHODS)}, got {self.method!r}")
        if self.tokens is None and self.duration is None:
            raise ValueError("give --tokens N or --duration S (or both): the run needs a budget")
        if self.learners < 1 or self.sync_shards < 1:
            raise ValueError("need at least one learner and one synchronizer shard")
        if self.tokens is not None and self.tokens < 1 or self.duration is not None and self.duration <= 0:
            raise ValueError("--tokens and --duration must be positive")
        object.__setattr__(self, "algorithm", methods.algorithm_for(self.method, self.algorithm, self.learners))

    @property
    def bulk_min_bandwidth(self) -> float | None:
        """MB/s the synchronizers' push and fetch deadlines assume: the flag, else half the emulated
        link's rate (a whole-model push on a slow link must not outlive a deadline sized for 10 MB/s)."""
        if self.network.min_bandwidth is not None:
            return self.network.min_bandwidth
        return (
            max(0.001, min(10.0, self.network.link.bandwidth_mb_s / 2))
            if self.network.link.bandwidth_mb_s > 0
            else None
        )

    @property
    def link_chunk_bytes(self) -> int | None:
        """Wire chunk that crosses the emulated link in a quarter of the failure timeout. The emulation
        holds a whole chunk back until its bytes are paid for, where a real link trickles them; a 1 MiB
        chunk on a slow link would leave the stream silent past the synchronizer's idle limit."""
        if not self.network.link.bandwidth_mb_s > 0:
            return None
        fitting = int(self.network.link.bandwidth_mb_s * 1e6 * Timeouts.derive(self.heartbeat).failure / 4) // 16 * 16
        return min(DEFAULT_CHUNK_BYTES, max(4096, fitting))

    @property
    def horizon(self) -> float:
        """How far ahead faults are drawn: the duration, or a generous bound for token budgets."""
        return self.duration if self.duration is not None else 24 * 3600.0

    def sync_dir(self, shard: int) -> Path:
        return self.run_dir / f"sync-{shard}"

    def learner_dir(self, m: int) -> Path:
        return self.run_dir / f"learner-{m}"

    def _model_settings(self) -> dict[str, object]:
        return {
            "model": self.model,
            "model_size": self.model_size,
            "seq_len": self.seq_len,
            "seed": self.seed,
            "learners": self.learners,
            "data": self.data,
        }

    def algorithm_settings(self) -> dict[str, object]:
        """The algorithm as `ddiloco synchronizer`'s flags: every `AlgorithmConfig` field under its own
        name, but overlap_auto (said by --overlap auto) and synchronous (said by --method)."""
        a = self.algorithm
        knobs: dict[str, object] = {
            f.name: getattr(a, f.name) for f in fields(AlgorithmConfig) if f.name not in ("overlap_auto", "synchronous")
        }
        knobs["overlap"] = "auto" if a.overlap_auto else a.overlap
        return {"method": self.method, **knobs}

    def synchronizer_settings(self, shard: int) -> dict[str, object]:
        """Shard `shard`'s part of the tree, keyed by `ddiloco synchronizer`'s flags (None: not given);
        where it listens is the launcher's to say (`synchronizer_args`)."""
        d = self.sync_dir(shard)
        return {
            **self._model_settings(),
            **self.algorithm_settings(),
            "shard": shard,
            "num_shards": self.sync_shards,
            "max_learners": self.learners,
            "checkpoint_dir": str(d),
            "checkpoint_every": self.checkpoint_every,
            "threads": self.threads,
            "heartbeat": self.heartbeat,
            "event_log": str(d / "events.jsonl"),
            "summary": str(d / "summary.json"),
            "codec_down": self.network.codec_down,
            "bulk_socket": self.network.bulk_socket,
            "tokens": self.tokens,
            "duration": self.duration,
            "min_bandwidth": self.bulk_min_bandwidth,
            "chunk_bytes": self.link_chunk_bytes,
        }

    def synchronizer_args(self, shard: int, port: int, settings_file: bool = True) -> list[str]:
        """`ddiloco synchronizer`'s command line: where it listens, and its settings in a file of its own
        (`--config sync-N/synchronizer.toml`, written here), or as flags (`settings_file=False`: a
        run directory that is not this machine's, as SkyPilot's)."""
        d = self.sync_dir(shard)
        where = [
            "--host",
            self.network.sync_hosts[shard] if self.network.sync_hosts else "127.0.0.1",
            "--port",
            str(port),
            "--address-file",
            str(d / "address"),
        ]
        file = d / "synchronizer.toml" if settings_file else None
        return child_args("synchronizer", where, self.synchronizer_settings(shard), file)

    def inner_settings(self) -> dict[str, object]:
        """The inner optimizer as `ddiloco learner`'s flags (the rest of `InnerConfig` is its defaults)."""
        i = self.inner
        return {
            "batch_size": i.batch_size,
            "inner_lr": i.lr,
            "inner_optimizer": i.optimizer,
            "slow_momentum": i.slow_momentum,
            "slow_weight": i.slow_weight,
            "rewarm_steps": i.rewarm_steps,
        }

    def learner_settings(self, m: int) -> dict[str, object]:
        """Learner `m`'s settings, keyed by `ddiloco learner`'s flags (None: not given)."""
        link = self.network.link
        return {
            "id": m,
            **self._model_settings(),
            "shard_layout": self.shard_layout,
            **self.inner_settings(),
            "codec": self.network.codec,
            "state_dir": str(self.learner_dir(m)),
            "threads": self.threads,
            "save_state_every": self.algorithm.sync_every,
            "orphan_timeout": self.orphan_timeout,
            "min_step_seconds": self.min_step_seconds or None,
            "peer_recovery": self.peer_recovery,
            "net_delay": self.chaos.net_delay_ms or None,
            "net_latency": link.latency_ms or None,
            "net_bandwidth": link.bandwidth_mb_s or None,
            "net_jitter": link.jitter_ms or None,
        }

    def learner_args(self, m: int, addresses: list[str], settings_file: bool = True) -> list[str]:
        """`ddiloco learner`'s command line: whom it connects to, and its settings in a file of its own
        (`--config learner-M/learner.toml`, written here), or as flags (`settings_file=False`)."""
        file = self.learner_dir(m) / "learner.toml" if settings_file else None
        return child_args("learner", ["--connect", ",".join(addresses)], self.learner_settings(m), file)

    def as_dict(self) -> dict:
        """The settings the run's synchronizers use, what the user asked with what the method sets
        applied (`core.methods`), in the keys a data-parallel run's summary shares."""
        a = self.algorithm
        return {
            "method": self.method,
            "model": self.model,
            "learners": self.learners,
            "seed": self.seed,
            "fragments": a.fragments,
            "sync_every": a.sync_every,
            "overlap": "auto" if a.overlap_auto and not a.synchronous else a.overlap,
            "late": a.late,
            "quorum": a.quorum,
            "grace": a.grace,
            "merge": a.merge,
        }


def child_args(command: str, given: list[str], settings: dict[str, object], file: Path | None) -> list[str]:
    """A child's command line: `given` flags, and its settings in `file` (written here; `--config`) or,
    without a file, as flags."""
    if file is None:
        return [command, *given, *as_flags(settings)]
    file.parent.mkdir(parents=True, exist_ok=True)
    write_toml(file, settings)
    return [command, "--config", str(file), *given]


def as_flags(settings: dict[str, object]) -> list[str]:
    """Settings as a command line: --name VALUE, or --name / --no-name for a switch; None: not given."""
    args: list[str] = []
    for name, value in settings.items():
        if value is None:
            continue
        flag = name.replace("_", "-")
        if isinstance(value, bool):
            args.append(f"--{flag}" if value else f"--no-{flag}")
        else:
            args += [f"--{flag}", str(value)]
    return args


def write_toml(path: Path, settings: dict[str, object]) -> None:
    """A child's `--config` file (`cli.config_file`): one `key = value` line per setting given, the
    keys its flags' names. Strings as JSON's (a subset of TOML's basic strings), numbers as Python
    writes them (TOML's too: `1e-05`, `inf`)."""
    lines = []
    for name, value in settings.items():
        if value is None:
            continue
        if isinstance(value, bool):
            text = "true" if value else "false"
        elif isinstance(value, (int, float)):
            text = repr(value)
        else:
            text = json.dumps(str(value))
        lines.append(f"{name} = {text}")
    atomic_write(path, ("\n".join(lines) + "\n").encode(), durable=False)
