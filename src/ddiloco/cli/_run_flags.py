"""The flags of `ddiloco run`, declared once (`_flags.takes` makes them the command's options, in this
order), in the panels of its --help: Run (what to train, how long, where), Algorithm (the flags it
shares with `ddiloco sim` and `ddiloco synchronizer`, `options`), Network (the processes' links and
wire), Chaos (the faults to inject), Backends (each backend's own: their help starts with its name,
slurm or skypilot) and Output. `RunCommand.common` names the flags the short --help shows, the first
of each panel; --help-all shows every one.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import typer

from . import options
from ._help import ShortHelp
from .options import BACKENDS, CHAOS, NETWORK, OUTPUT, RUN


@dataclass(frozen=True)
class RunFlags:
    """What `ddiloco run` was given: one field per flag (`cli/run.py` builds the run's config from it)."""

    # Run: what to train, for how long, where
    method: options.RunMethod = typer.Option(
        "decoupled",
        help="decoupled, diloco (synchronous baseline: every learner waits at every outer step), streaming "
        "(Streaming DiLoCo: fragments and overlap tau, every learner in every round, a learner waits once a "
        "fragment is more than tau steps overdue), or the data-parallel baselines ddp and elastic-ddp "
        "(docs/dataparallel.md).",
        rich_help_panel=RUN,
    )
    learners: int = options.in_panel(options.LEARNERS, RUN)
    tokens: int | None = typer.Option(
        None,
        min=options.TOKENS_MIN,
        max=options.TOKENS_MAX,
        help="Stop once the learners trained this many tokens (default 400000 unless --duration is given).",
        rich_help_panel=RUN,
    )
    duration: float | None = typer.Option(
        None,
        min=options.DURATION_MIN,
        max=options.DURATION_MAX,
        help="Stop this many seconds after the start (a restarted synchronizer keeps it).",
        rich_help_panel=RUN,
    )
    data: str | None = options.in_panel(options.DATA, RUN)
    model: options.Model = typer.Option("gpt", help="The model to train.", rich_help_panel=RUN)
    model_size: options.ModelSize = typer.Option(
        "default", help="default (~1M parameters) or tiny.", rich_help_panel=RUN
    )
    run_dir: Path | None = typer.Option(
        None, help="Logs, checkpoints, event log (default runs/run-<time>).", rich_help_panel=RUN
    )
    seed: int = typer.Option(0, help="Seed of the model, the data order and the chaos schedule.", rich_help_panel=RUN)
    batch_size: int = typer.Option(
        options.INNER.batch_size, min=1, help="Sequences (or images) per learner step.", rich_help_panel=RUN
    )
    inner_lr: float | None = typer.Option(
        None, min=0.0, help=f"Peak inner learning rate (default: {options.DEFAULT_LR_TEXT}).", rich_help_panel=RUN
    )
    inner_optimizer: options.InnerOptimizer = options.in_panel(options.INNER_OPTIMIZER, RUN)
    slow_momentum: float = options.in_panel(options.SLOW_MOMENTUM, RUN)
    slow_weight: float = options.in_panel(options.SLOW_WEIGHT, RUN)
    rewarm_steps: int = options.in_panel(options.REWARM_STEPS, RUN)
    seq_len: int = options.in_panel(options.SEQ_LEN, RUN)
    shard_layout: options.ShardLayout = options.in_panel(options.SHARD_LAYOUT, RUN)
    sync_shards: int = typer.Option(
        1, min=1, help="Synchronizer shard processes (fragments spread round-robin).", rich_help_panel=RUN
    )
    checkpoint_every: int = typer.Option(1, min=0, help="Synchronizer merges between checkpoints.", rich_help_panel=RUN)
    eval_every: float = typer.Option(
        20.0,
        min=0.0,
        help="Seconds between evaluations of the global model (live view, metrics.jsonl; 0: none).",
        rich_help_panel=RUN,
    )
    eval_batches: int = typer.Option(
        20,
        min=1,
        help="Validation batches of every evaluation, along the way and final (one yardstick).",
        rich_help_panel=RUN,
    )
    threads: int = options.in_panel(options.THREADS, RUN)
    min_step_seconds: float = typer.Option(
        0.0,
        min=0.0,
        help="Pad every learner step to at least this long: emulates "
        "learners with their own accelerators on a shared CPU.",
        rich_help_panel=RUN,
    )

    # Algorithm (`options`: the same flags as `ddiloco sim` and `ddiloco synchronizer`)
    sync_every: int = options.SYNC_EVERY
    fragments: int | None = options.FRAGMENTS
    overlap: str = options.OVERLAP
    quorum: int = options.QUORUM
    grace: float = options.GRACE
    merge: options.Merge | None = options.MERGE
    outer_lr: float = options.OUTER_LR
    outer_momentum: float = options.OUTER_MOMENTUM
    arrival: options.Arrival = options.ARRIVAL
    final_momentum: bool = options.FINAL_MOMENTUM
    late: options.Late = options.LATE
    max_staleness: int = options.MAX_STALENESS
    staleness_discount: float = options.STALENESS_DISCOUNT
    ema: float = options.EMA
    max_outer_norm_ratio: float = options.MAX_OUTER_NORM_RATIO
    outer_debias: bool = options.OUTER_DEBIAS
    outer_restart_every: int = options.OUTER_RESTART_EVERY
    outer_lr_per_learner: float = options.OUTER_LR_PER_LEARNER
    stale_correction: bool = options.STALE_CORRECTION

    # Network: the processes' links, emulated or real, and what travels on them
    network: options.Network = typer.Option(
        "loopback",
        help="loopback: every process on 127.0.0.1; hosts (root): each on a host of its own with real, "
        "kernel-shaped links (docs/hosts.md).",
        rich_help_panel=NETWORK,
    )
    codec: options.Codec = options.CODEC
    net_latency: float = options.NET_LATENCY
    net_bandwidth: float = options.NET_BANDWIDTH
    net_jitter: float = options.NET_JITTER
    link: list[str] | None = typer.Option(
        None,
        help='--network hosts: the learners\' link, e.g. "latency=80ms,jitter=10ms,rate=1gbit,loss=0.1%"; '
        '"learner1=SPEC" or "sync0=SPEC" for one host (repeatable).',
        rich_help_panel=NETWORK,
    )
    net_delay: float = typer.Option(
        0.0, min=0.0, help="Added latency per message, milliseconds.", rich_help_panel=NETWORK
    )
    codec_down: options.CodecDown = typer.Option(
        options.CodecDown.bf16,
        help="Codec of global fragments sent to learners (the synchronizer's master copy stays fp32).",
        rich_help_panel=NETWORK,
    )
    bulk_socket: bool = typer.Option(
        True,
        help="Learners push on the synchronizers' plain TCP bulk plane "
        "(ddiloco synchronizer --bulk-socket); --no-bulk-socket: over gRPC.",
        rich_help_panel=NETWORK,
    )
    allreduce_precision: options.AllreducePrecision = typer.Option(
        options.AllreducePrecision.bf16,
        help="--method ddp|elastic-ddp: what the gradients' all-reduce sends and sums in (fp32: DDP's own).",
        rich_help_panel=NETWORK,
    )
    heartbeat: float = options.HEARTBEAT
    min_bandwidth: float | None = options.MIN_BANDWIDTH
    orphan_timeout: float = options.ORPHAN_TIMEOUT
    token: str | None = typer.Option(
        None, help="Shared secret for the processes (or $DDILOCO_TOKEN).", rich_help_panel=NETWORK
    )

    # Chaos: the faults to inject
    learner_mtbf: float | None = typer.Option(
        None,
        min=0.01,
        help="kill -9 each learner at exponential intervals of this mean (seconds).",
        rich_help_panel=CHAOS,
    )
    learner_down: float = typer.Option(
        15.0, min=0.0, help="Seconds before a killed learner is restarted.", rich_help_panel=CHAOS
    )
    straggle: float | None = typer.Option(
        None,
        min=0.01,
        help="SIGSTOP a random learner for this many seconds now and then.",
        rich_help_panel=CHAOS,
    )
    straggle_every: float = typer.Option(
        30.0, min=0.01, help="Mean seconds between two stragglers.", rich_help_panel=CHAOS
    )
    kill_synchronizer_at: float | None = typer.Option(
        None,
        min=0.0,
        help="kill -9 a synchronizer shard (--kill-shards) this many seconds in, then restart it.",
        rich_help_panel=CHAOS,
    )
    kill_shards: str = typer.Option(
        "0",
        help="Shards --kill-synchronizer-at kills, one after the other: a comma list or all.",
        rich_help_panel=CHAOS,
    )
    kill_every: float = typer.Option(
        5.0, min=0.01, max=1e6, help="Seconds between the kills of two shards.", rich_help_panel=CHAOS
    )
    synchronizer_down: float = typer.Option(
        1.0, min=0.0, help="Seconds before a killed synchronizer is restarted.", rich_help_panel=CHAOS
    )
    chaos_trace: Path | None = typer.Option(
        None, help="Replay learner outages (CSV learner,down_at,up_at).", rich_help_panel=CHAOS
    )

    # Backends: where the processes run; each backend's own flags
    backend: options.Backend = typer.Option(
        "local",
        help="local: processes on this machine; slurm: one job per "
        "synchronizer shard and per learner (docs/cluster.md).",
        rich_help_panel=BACKENDS,
    )
    dry_run: bool = typer.Option(
        False, help="slurm, skypilot: write the sbatch scripts (task YAMLs) and stop.", rich_help_panel=BACKENDS
    )
    detach: bool = typer.Option(
        False,
        help="slurm, skypilot: submit and return (end it with ddiloco slurm-stop or skypilot-stop RUN_DIR).",
        rich_help_panel=BACKENDS,
    )
    partition: str | None = typer.Option(None, help="slurm: partition of every job.", rich_help_panel=BACKENDS)
    account: str | None = typer.Option(None, help="slurm: account of every job.", rich_help_panel=BACKENDS)
    time_limit: str | None = typer.Option(
        None, "--time", help="slurm: time limit of every job (sbatch --time).", rich_help_panel=BACKENDS
    )
    nodes_per_learner: int = typer.Option(
        1, min=1, max=4096, help="slurm: nodes of each learner job.", rich_help_panel=BACKENDS
    )
    procs_per_node: int = typer.Option(
        1,
        min=1,
        max=1024,
        help="slurm: ranks per node of each learner "
        "(torchrun --nproc-per-node; more than one rank in all uses torchrun).",
        rich_help_panel=BACKENDS,
    )
    gpus_per_node: int = typer.Option(
        0, min=0, max=1024, help="slurm: GPUs per node of each learner job.", rich_help_panel=BACKENDS
    )
    cpus_per_task: int | None = typer.Option(
        None, min=1, max=4096, help="slurm: CPUs of each job's task.", rich_help_panel=BACKENDS
    )
    sync_host: str = typer.Option(
        "auto",
        help="slurm: the address the synchronizer listens on; auto: its node's "
        "first address (a token is then generated unless given).",
        rich_help_panel=BACKENDS,
    )
    term_grace: float = typer.Option(
        20.0,
        min=0.1,
        max=86400.0,
        help="slurm: seconds a preempted learner has to send its work and exit (below Slurm's KillWait).",
        rich_help_panel=BACKENDS,
    )
    max_restarts: int = typer.Option(
        2,
        min=0,
        max=100,
        help="slurm: restarts inside one job of a synchronizer "
        "shard that died (from its checkpoint) or of a torchrun group, before the job "
        "fails.",
        rich_help_panel=BACKENDS,
    )
    peer_recovery: bool = typer.Option(
        True,
        help="A learner restarted without its inner optimizer state copies a live learner's (docs/cluster.md).",
        rich_help_panel=BACKENDS,
    )
    learner_state: options.LearnerState = typer.Option(
        "shared",
        help="slurm: where a learner keeps its inner "
        "optimizer state: shared (the run directory: a requeued job "
        "finds it) or scratch (node-local, gone at every requeue, as "
        "on a new machine: peer recovery restores it).",
        rich_help_panel=BACKENDS,
    )
    sbatch_arg: list[str] | None = typer.Option(
        None,
        help="slurm: one more sbatch option for every job, e.g. --sbatch-arg=--qos=preempt (repeatable).",
        rich_help_panel=BACKENDS,
    )
    store: str | None = typer.Option(
        None,
        help="skypilot: the run directory's store: s3://.., volume:NAME or a path.",
        rich_help_panel=BACKENDS,
    )
    infra: list[str] | None = typer.Option(
        None,
        help="skypilot: infra, e.g. aws/us-east-1; ROLE=INFRA for sync, learner or learnerM (repeatable).",
        rich_help_panel=BACKENDS,
    )
    accelerators: list[str] | None = typer.Option(
        None, help="skypilot: e.g. H100:8, or ROLE=ACC (as --infra).", rich_help_panel=BACKENDS
    )
    spot: bool = typer.Option(
        True,
        help="skypilot: learners on spot capacity (the synchronizer is on-demand).",
        rich_help_panel=BACKENDS,
    )
    tls: bool | None = typer.Option(
        None, help="skypilot: TLS; default on unless all is on one Kubernetes/Slurm.", rich_help_panel=BACKENDS
    )
    sky_port: int = typer.Option(
        7070,
        min=1024,
        max=65000,
        help="skypilot: shard S listens on port+S, bulk +100.",
        rich_help_panel=BACKENDS,
    )

    # Output: what the run prints and where its metrics go
    as_json: bool = typer.Option(
        False, "--json", help="End with one line of JSON holding the summary.", rich_help_panel=OUTPUT
    )
    quiet: bool = typer.Option(False, help="No live view.", rich_help_panel=OUTPUT)
    dashboard: bool = typer.Option(
        True,
        help="Serve a live web dashboard (its address is printed and kept in the run directory's dashboard.url).",
        rich_help_panel=OUTPUT,
    )
    tensorboard: Path | None = options.TENSORBOARD
    wandb: bool = options.WANDB
    wandb_mode: options.WandbMode = options.WANDB_MODE
    wandb_project: str = options.WANDB_PROJECT
    dashboard_host: str = options.DASHBOARD_HOST
    dashboard_port: int = options.DASHBOARD_PORT


class RunCommand(ShortHelp):
    """`ddiloco run --help` shows these flags (the common first few of each panel); --help-all every one."""

    common = frozenset(
        {
            *("method", "learners", "tokens", "duration", "data", "model", "model_size", "run_dir", "seed"),
            *("sync_every", "fragments", "overlap", "quorum", "grace", "merge"),
            *("network", "codec", "net_latency", "net_bandwidth"),
            *("learner_mtbf", "straggle", "kill_synchronizer_at", "chaos_trace"),
            "backend",
            *("as_json", "quiet", "dashboard", "tensorboard", "wandb"),
        }
    )
