"""What one data-parallel run is, and the command line of each of its workers.

The model, data and inner-optimizer flags are those of `ddiloco run` (`launch.config.RunConfig`), so
that a baseline and a ddiloco run given the same flags train the same model on the same shards with
the same optimizer (AdamW, or the options that have a meaning here: Muon, the slow momentum) and schedule.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, field
from pathlib import Path

from ..chaos.injector import ChaosSettings
from ..learner.wan import LinkConfig
from ..train.inner import InnerConfig
from ..train.streams import SHARD_LAYOUTS, check_shard_layout

METHODS = ("ddp", "elastic-ddp")
PRECISIONS = ("bf16", "fp32")  # of the all-reduce (`link.DTYPES`: their torch dtypes)


@dataclass(frozen=True)
class DataParallelConfig:
    run_dir: Path
    method: str = "ddp"  # ddp: a failure restarts the whole job; elastic-ddp: the survivors regroup
    model: str = "gpt"
    model_size: str = "default"
    data: str | None = None
    seq_len: int = 128
    shard_layout: str = SHARD_LAYOUTS[0]  # how the text is dealt to the workers, as to learners (`train.streams`)
    workers: int = 4  # M: the data is split into M shards, worker m trains shard m (as learner m does)
    # each worker's inner optimizer, as a learner's (batch per worker and step); of the inner options
    # data-parallel training has the optimizer and the slow momentum, not the re-warm-up (no adoptions)
    inner: InnerConfig = field(default_factory=InnerConfig)
    seed: int = 0
    tokens: int | None = None
    duration: float | None = None
    checkpoint_every: int = 24  # steps between checkpoints (a learner saves its state every --sync-every)
    min_step_seconds: float = 0.0
    min_workers: int = 1  # elastic-ddp: the fewest workers a generation may have
    learner_down: float = 15.0  # seconds before a worker that died (not by the trace) is started again
    eval_batches: int = 20
    eval_every: float = 20.0  # seconds between evaluations of the newest checkpoint (0: only the final)
    threads: int = 1
    device: str = "auto"
    collective_timeout: float = 30.0  # a collective that waits longer than this fails (a frozen peer)
    join_timeout: float = 300.0  # a worker that is given no generation within this exits with an error
    time_limit: float = 24 * 3600.0  # the launcher ends a run that has not finished by then (an error)
    # the launcher ends a run (an error naming what it waited for) in which no generation formed for
    # this long while the workers a generation needs were running: they hang before saying they are
    # ready, or cannot reach each other. Time spent waiting for a worker that is down does not count.
    stall_limit: float = 1800.0
    # the emulated link under the ring all-reduce (`link`): per hop and per worker, as the learners' link
    link: LinkConfig = field(default_factory=LinkConfig)
    # what the all-reduce sends and sums in: bf16 (what users run; the optimizer's gradients are fp32
    # again after it) or fp32 (DDP's own)
    allreduce_precision: str = "bf16"
    chaos: ChaosSettings = field(default_factory=ChaosSettings)

    def __post_init__(self) -> None:
        check_shard_layout(self.shard_layout)
        if self.method not in METHODS:
            raise ValueError(f"data-parallel methods are {', '.join(METHODS)}, got {self.method!r}")
        if self.tokens is None and self.duration is None:
            raise ValueError("give --tokens N or --duration S (or both): the run needs a budget")
        if self.tokens is not None and self.tokens < 1 or self.duration is not None and self.duration <= 0:
            raise ValueError("--tokens and --duration must be positive")
        if self.workers < 1 or not 1 <= self.min_workers <= self.workers:
            raise ValueError("need at least one worker, and 1 <= min_workers <= workers")
        if self.checkpoint_every < 1 or self.min_step_seconds < 0:
            raise ValueError("checkpoint_every must be >= 1, min_step_seconds >= 0")
        if not (self.collective_timeout > 0 and self.join_timeout > 0 and self.learner_down >= 0):
            raise ValueError("timeouts must be > 0 and learner_down >= 0")
        if not (self.stall_limit > 0 and self.time_limit > 0):
            raise ValueError("--stall-limit and --time-limit must be > 0")
        if self.allreduce_precision not in PRECISIONS:
            raise ValueError(
                f"--allreduce-precision is one of {', '.join(PRECISIONS)}, got {self.allreduce_precision!r}"
            )
        if self.inner.rewarm_steps:
            raise ValueError("--rewarm-steps follows adoptions of a global model; data-parallel has none")

    @property
    def elastic(self) -> bool:
        return self.method == "elastic-ddp"

    @property
    def horizon(self) -> float:
        """How far ahead chaos is drawn (as `RunConfig.horizon`)."""
        return self.duration if self.duration is not None else 24 * 3600.0

    def worker_dir(self, m: int) -> Path:
        """The same folder name a learner gets, so reports find each worker's logs and journals."""
        return self.run_dir / f"learner-{m}"

    @property
    def checkpoint_dir(self) -> Path:
        return self.run_dir / "checkpoint"

    def worker_command(
        self, slot: int, store_port: int, clock_origin: float, secret_file: Path | None = None
    ) -> list[str]:
        """`python -m ddiloco.dataparallel worker ...` for worker `slot` (the store's secret by its
        file's path: a command line is readable by every user of the host)."""
        args = [
            sys.executable,
            "-m",
            "ddiloco.dataparallel",
            "worker",
            "--slot",
            str(slot),
            "--store-port",
            str(store_port),
            "--run-dir",
            str(self.run_dir),
            "--clock-origin",
            repr(clock_origin),
            "--workers",
            str(self.workers),
            "--model",
            self.model,
            "--model-size",
            self.model_size,
            "--seq-len",
            str(self.seq_len),
            "--shard-layout",
            self.shard_layout,
            "--batch-size",
            str(self.inner.batch_size),
            "--inner-lr",
            repr(self.inner.lr),
            "--inner-optimizer",
            self.inner.optimizer,
            "--slow-momentum",
            repr(self.inner.slow_momentum),
            "--slow-weight",
            repr(self.inner.slow_weight),
            "--seed",
            str(self.seed),
            "--checkpoint-every",
            str(self.checkpoint_every),
            "--min-step-seconds",
            repr(self.min_step_seconds),
            "--threads",
            str(self.threads),
            "--device",
            self.device,
            "--collective-timeout",
            repr(self.collective_timeout),
            "--join-timeout",
            repr(self.join_timeout),
            "--allreduce-precision",
            self.allreduce_precision,
        ]
        if self.data is not None:
            args += ["--data", self.data]
        if secret_file is not None:
            args += ["--store-secret-file", str(secret_file)]
        for flag, value in (
            ("--net-latency", self.link.latency_ms),
            ("--net-bandwidth", self.link.bandwidth_mb_s),
            ("--net-jitter", self.link.jitter_ms),
        ):
            if value:
                args += [flag, repr(value)]
        if self.tokens is not None:
            args += ["--tokens", str(self.tokens)]
        if self.duration is not None:
            args += ["--duration", repr(self.duration)]
        return args

    def as_dict(self) -> dict:
        """The method's settings in the keys `RunConfig.as_dict` uses, for summaries side by side."""
        return {
            "method": self.method,
            "model": self.model,
            "learners": self.workers,
            "seed": self.seed,
            "fragments": 1,
            "sync_every": 1,  # every step is all-reduced
            "overlap": 0,
            "quorum": self.min_workers if self.elastic else self.workers,
            "grace": 0.0,
            "merge": "allreduce",
        }
