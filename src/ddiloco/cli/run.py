"""`ddiloco run`: the synchronizer and M learner processes on this machine, supervised, with chaos;
or, with `--backend slurm`, the same processes as Slurm jobs (`_slurm`)."""

from __future__ import annotations

import time
from pathlib import Path

import typer

from . import app, options
from .run_options import check_backend_flags, hosts_plan, kill_shard_list


@app.command("run")
def run(
    method: options.RunMethod = typer.Option(
        "decoupled",
        help="decoupled, diloco (synchronous baseline: every learner waits at every outer step), streaming "
        "(Streaming DiLoCo: fragments and overlap tau, every learner in every round, a learner waits once a "
        "fragment is more than tau steps overdue), or the data-parallel baselines ddp and elastic-ddp "
        "(docs/dataparallel.md).",
    ),
    model: options.Model = typer.Option("gpt", help="The model to train."),
    model_size: options.ModelSize = typer.Option("default", help="default (~1M parameters) or tiny."),
    data: str | None = options.DATA,
    seq_len: int = options.SEQ_LEN,
    learners: int = options.LEARNERS,
    fragments: int | None = options.FRAGMENTS,
    sync_every: int = options.SYNC_EVERY,
    overlap: str = options.OVERLAP,
    quorum: int = options.QUORUM,
    grace: float = options.GRACE,
    merge: options.Merge | None = options.MERGE,
    outer_lr: float = options.OUTER_LR,
    outer_momentum: float = options.OUTER_MOMENTUM,
    arrival: options.Arrival = options.ARRIVAL,
    final_momentum: bool = options.FINAL_MOMENTUM,
    late: options.Late = options.LATE,
    max_staleness: int = options.MAX_STALENESS,
    staleness_discount: float = options.STALENESS_DISCOUNT,
    inner_lr: float = typer.Option(3e-3, min=0.0, help="Peak inner AdamW learning rate."),
    batch_size: int = typer.Option(16, min=1, help="Sequences (or images) per learner step."),
    tokens: int | None = typer.Option(
        None,
        min=options.TOKENS_MIN,
        max=options.TOKENS_MAX,
        help="Stop once the learners trained this many tokens (default 400000 unless --duration is given).",
    ),
    duration: float | None = typer.Option(
        None,
        min=options.DURATION_MIN,
        max=options.DURATION_MAX,
        help="Stop this many seconds after the start (a restarted synchronizer keeps it).",
    ),
    seed: int = typer.Option(0, help="Seed of the model, the data order and the chaos schedule."),
    sync_shards: int = typer.Option(1, min=1, help="Synchronizer shard processes (fragments spread round-robin)."),
    codec: options.Codec = options.CODEC,
    codec_down: options.CodecDown = typer.Option(
        options.CodecDown.bf16,
        help="Codec of global fragments sent to learners (the synchronizer's master copy stays fp32).",
    ),
    bulk_socket: bool = typer.Option(
        True,
        help="Learners push on the synchronizers' plain TCP bulk plane "
        "(ddiloco synchronizer --bulk-socket); --no-bulk-socket: over gRPC.",
    ),
    heartbeat: float = options.HEARTBEAT,
    min_bandwidth: float | None = options.MIN_BANDWIDTH,
    checkpoint_every: int = typer.Option(1, min=0, help="Synchronizer merges between checkpoints."),
    threads: int = options.THREADS,
    min_step_seconds: float = typer.Option(
        0.0,
        min=0.0,
        help="Pad every learner step to at least this long: emulates "
        "learners with their own accelerators on a shared CPU.",
    ),
    run_dir: Path | None = typer.Option(None, help="Logs, checkpoints, event log (default runs/run-<time>)."),
    learner_mtbf: float | None = typer.Option(
        None, min=0.01, help="kill -9 each learner at exponential intervals of this mean (seconds)."
    ),
    learner_down: float = typer.Option(15.0, min=0.0, help="Seconds before a killed learner is restarted."),
    straggle: float | None = typer.Option(
        None, min=0.01, help="SIGSTOP a random learner for this many seconds now and then."
    ),
    straggle_every: float = typer.Option(30.0, min=0.01, help="Mean seconds between two stragglers."),
    kill_synchronizer_at: float | None = typer.Option(
        None, min=0.0, help="kill -9 a synchronizer shard (--kill-shards) this many seconds in, then restart it."
    ),
    kill_shards: str = typer.Option(
        "0", help="Shards --kill-synchronizer-at kills, one after the other: a comma list or all."
    ),
    kill_every: float = typer.Option(5.0, min=0.01, max=1e6, help="Seconds between the kills of two shards."),
    synchronizer_down: float = typer.Option(1.0, min=0.0, help="Seconds before a killed synchronizer is restarted."),
    net_delay: float = typer.Option(0.0, min=0.0, help="Added latency per message, milliseconds."),
    net_latency: float = options.NET_LATENCY,
    net_bandwidth: float = options.NET_BANDWIDTH,
    net_jitter: float = options.NET_JITTER,
    chaos_trace: Path | None = typer.Option(None, help="Replay learner outages (CSV learner,down_at,up_at)."),
    eval_batches: int = typer.Option(20, min=1, help="Validation batches for the final evaluation."),
    eval_every: float = typer.Option(
        20.0, min=0.0, help="Seconds between evaluations of the global model (live view, metrics.jsonl; 0: none)."
    ),
    token: str | None = typer.Option(None, help="Shared secret for the processes (or $DDILOCO_TOKEN)."),
    tensorboard: Path | None = options.TENSORBOARD,
    wandb: bool = options.WANDB,
    wandb_mode: options.WandbMode = options.WANDB_MODE,
    wandb_project: str = options.WANDB_PROJECT,
    dashboard: bool = typer.Option(
        True, help="Serve a live web dashboard (its address is printed and kept in the run directory's dashboard.url)."
    ),
    dashboard_host: str = options.DASHBOARD_HOST,
    dashboard_port: int = options.DASHBOARD_PORT,
    as_json: bool = typer.Option(False, "--json", help="End with one line of JSON holding the summary."),
    quiet: bool = typer.Option(False, help="No live view."),
    network: options.Network = typer.Option(
        "loopback",
        help="loopback: every process on 127.0.0.1; hosts (root): each on a host of its own with real, "
        "kernel-shaped links (docs/hosts.md).",
    ),
    link: list[str] | None = typer.Option(
        None,
        help='--network hosts: the learners\' link, e.g. "latency=80ms,jitter=10ms,rate=1gbit,loss=0.1%"; '
        '"learner1=SPEC" or "sync0=SPEC" for one host (repeatable).',
    ),
    backend: options.Backend = typer.Option(
        "local",
        help="local: processes on this machine; slurm: one job per "
        "synchronizer shard and per learner (docs/cluster.md).",
    ),
    dry_run: bool = typer.Option(False, help="slurm, skypilot: write the sbatch scripts (task YAMLs) and stop."),
    detach: bool = typer.Option(
        False, help="slurm, skypilot: submit and return (end it with ddiloco slurm-stop or skypilot-stop RUN_DIR)."
    ),
    partition: str | None = typer.Option(None, help="slurm: partition of every job."),
    account: str | None = typer.Option(None, help="slurm: account of every job."),
    time_limit: str | None = typer.Option(None, "--time", help="slurm: time limit of every job (sbatch --time)."),
    nodes_per_learner: int = typer.Option(1, min=1, max=4096, help="slurm: nodes of each learner job."),
    procs_per_node: int = typer.Option(
        1,
        min=1,
        max=1024,
        help="slurm: ranks per node of each learner "
        "(torchrun --nproc-per-node; more than one rank in all uses torchrun).",
    ),
    gpus_per_node: int = typer.Option(0, min=0, max=1024, help="slurm: GPUs per node of each learner job."),
    cpus_per_task: int | None = typer.Option(None, min=1, max=4096, help="slurm: CPUs of each job's task."),
    sync_host: str = typer.Option(
        "auto",
        help="slurm: the address the synchronizer listens on; auto: its node's "
        "first address (a token is then generated unless given).",
    ),
    term_grace: float = typer.Option(
        20.0,
        min=0.1,
        max=86400.0,
        help="slurm: seconds a preempted learner has to send its work and exit (below Slurm's KillWait).",
    ),
    max_restarts: int = typer.Option(
        2,
        min=0,
        max=100,
        help="slurm: restarts inside one job of a synchronizer "
        "shard that died (from its checkpoint) or of a torchrun group, before the job "
        "fails.",
    ),
    peer_recovery: bool = typer.Option(
        True, help="A learner restarted without its inner optimizer state copies a live learner's (docs/cluster.md)."
    ),
    orphan_timeout: float = options.ORPHAN_TIMEOUT,
    learner_state: options.LearnerState = typer.Option(
        "shared",
        help="slurm: where a learner keeps its inner "
        "optimizer state: shared (the run directory: a requeued job "
        "finds it) or scratch (node-local, gone at every requeue, as "
        "on a new machine: peer recovery restores it).",
    ),
    sbatch_arg: list[str] | None = typer.Option(
        None, help="slurm: one more sbatch option for every job, e.g. --sbatch-arg=--qos=preempt (repeatable)."
    ),
    store: str | None = typer.Option(None, help="skypilot: the run directory's store: s3://.., volume:NAME or a path."),
    infra: list[str] | None = typer.Option(
        None, help="skypilot: infra, e.g. aws/us-east-1; ROLE=INFRA for sync, learner or learnerM (repeatable)."
    ),
    accelerators: list[str] | None = typer.Option(None, help="skypilot: e.g. H100:8, or ROLE=ACC (as --infra)."),
    spot: bool = typer.Option(True, help="skypilot: learners on spot capacity (the synchronizer is on-demand)."),
    tls: bool | None = typer.Option(None, help="skypilot: TLS; default on unless all is on one Kubernetes/Slurm."),
    sky_port: int = typer.Option(7070, min=1024, max=65000, help="skypilot: shard S listens on port+S, bulk +100."),
) -> None:
    """Train with real processes and real sockets, inject faults, report goodput, stalls and loss."""

    codec_name = options.Codec(codec).value
    codec_down_name = options.CodecDown(codec_down).value
    method, model, model_size, merge = options.plain(method, model, model_size, merge)

    from ..chaos.injector import ChaosSettings
    from ..chaos.trace import FailureTrace
    from ..launch.config import RunConfig
    from ..records import logsetup
    from ..wire import auth
    from .output import user_error

    on_hosts = options.plain(network)[0] == "hosts"
    if on_hosts and (options.plain(backend)[0] != "local" or method in ("ddp", "elastic-ddp")):
        raise user_error(
            ValueError("--network hosts: with --backend local and --method decoupled, diloco or streaming only")
        )
    slurm_flags = {  # `cluster.sbatch.SlurmOptions`' fields, for both launchers on Slurm
        "partition": partition,
        "account": account,
        "time_limit": time_limit,
        "nodes_per_learner": nodes_per_learner,
        "procs_per_node": procs_per_node,
        "gpus_per_node": gpus_per_node,
        "cpus_per_task": cpus_per_task,
        "host": sync_host,
        "term_grace": term_grace,
        "extra": tuple(sbatch_arg or ()),
        "max_restarts": max_restarts,
        "learner_state": options.plain(learner_state)[0],
    }
    wants_sinks = tensorboard is not None or wandb
    sky_given = bool(store or infra or accelerators or not spot or tls is not None or sky_port != 7070)
    try:
        given = check_backend_flags(options.plain(backend)[0], slurm_flags, dry_run, detach, sky_given, wants_sinks)
    except ValueError as exc:
        raise user_error(exc) from None

    def make_sinks(where: Path, config: object) -> list:
        """The metric sinks the flags ask for (none without --tensorboard, --wandb), for every launcher."""
        from ..records.rundir import jsonable
        from .output import metric_sinks

        return metric_sinks(tensorboard, wandb, wandb_mode, wandb_project, where, where.name, jsonable(config))

    logsetup.configure("run", "warning")
    try:  # before anything is built: a bad --link or a machine that cannot make hosts fails at once
        hosts = hosts_plan(
            options.plain(network)[0], link, learners, sync_shards, net_latency or net_bandwidth or net_jitter
        )
    except ValueError as exc:
        raise user_error(exc) from None
    try:
        trace = FailureTrace.load(chaos_trace) if chaos_trace is not None else None
        chaos = ChaosSettings(
            learner_mtbf=learner_mtbf,
            learner_down=learner_down,
            straggle=straggle,
            straggle_every=straggle_every,
            kill_synchronizer_at=kill_synchronizer_at,
            synchronizer_down=synchronizer_down,
            kill_shards=kill_shard_list(kill_shards, sync_shards),
            kill_every=kill_every,
            net_delay_ms=net_delay,
            trace=trace,
            seed=seed,
        )
        if trace is not None and any(o.learner >= learners for o in trace.outages):
            raise ValueError(f"{chaos_trace} names learners beyond 0..{learners - 1}")
        from ..api.model import fit_fragments
        from ..train.tasks import make_task

        task = make_task(model, data, seq_len=seq_len, model_size=model_size)
        if method in ("ddp", "elastic-ddp"):  # the data-parallel baselines have their own launcher
            from ._dataparallel import run_baseline

            if options.plain(backend)[0] not in ("local", "slurm") or kill_synchronizer_at is not None:
                raise ValueError(f"--method {method}: local or slurm backend, and there is no synchronizer to kill")
            if options.plain(backend)[0] == "slurm" and (dry_run or detach):
                raise ValueError(f"--method {method} on slurm: the launcher holds the store; no --dry-run, --detach")
            if net_delay:
                raise ValueError(f"--method {method}: --net-delay is not emulated here; use --net-latency")
            return run_baseline(
                method=method,
                model=model,
                model_size=model_size,
                data=data,
                seq_len=seq_len,
                learners=learners,
                batch_size=batch_size,
                inner_lr=inner_lr,
                seed=seed,
                tokens=tokens,
                duration=duration,
                sync_every=sync_every,
                min_step_seconds=min_step_seconds,
                eval_batches=eval_batches,
                eval_every=eval_every,
                threads=threads,
                chaos=chaos,
                net=(net_latency, net_bandwidth, net_jitter),
                run_dir=run_dir,
                as_json=as_json,
                slurm=slurm_flags if options.plain(backend)[0] == "slurm" else None,
                make_sinks=make_sinks,
            )
        fragments = fit_fragments(len(list(task.build_model(seed).parameters())), fragments, sync_every)
        config = RunConfig(
            run_dir=run_dir or Path("runs") / time.strftime("run-%Y%m%d-%H%M%S"),
            method=method,
            model=model,
            model_size=model_size,
            data=data,
            seq_len=seq_len,
            learners=learners,
            fragments=fragments,
            sync_every=sync_every,
            overlap=options.parse_overlap(overlap)[0],
            overlap_auto=options.parse_overlap(overlap)[1],
            late=options.plain(late)[0],
            max_staleness=max_staleness,
            staleness_discount=staleness_discount,
            quorum=quorum,
            grace=grace,
            merge=merge,
            outer_lr=outer_lr,
            outer_momentum=outer_momentum,
            arrival=options.plain(arrival)[0],
            final_momentum=final_momentum,
            inner_lr=inner_lr,
            batch_size=batch_size,
            seed=seed,
            tokens=tokens if tokens is not None or duration is not None else 400_000,
            duration=duration,
            sync_shards=sync_shards,
            codec=codec_name,
            codec_down=codec_down_name,
            bulk_socket=bulk_socket,
            wan=(net_latency, net_bandwidth, net_jitter),
            heartbeat=heartbeat,
            min_bandwidth=min_bandwidth,
            checkpoint_every=checkpoint_every,
            threads=options.shared_threads(threads, learners + sync_shards),
            min_step_seconds=min_step_seconds,
            eval_batches=eval_batches,
            eval_every=eval_every,
            token=auth.resolve_token(token),
            peer_recovery=peer_recovery,
            orphan_timeout=orphan_timeout,
            chaos=chaos,
        )
        try:
            config.run_dir.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise ValueError(f"--run-dir {config.run_dir}: cannot create it ({exc.strerror})") from None
    except (ValueError, FileNotFoundError, NotADirectoryError) as exc:
        raise user_error(exc) from None
    if options.plain(backend)[0] == "skypilot":
        from ._skypilot import run_from_cli

        sky = {"store": store, "infra": infra, "accelerators": accelerators, "spot": spot, "tls": tls, "port": sky_port}
        chaos_given = (learner_mtbf, straggle, kill_synchronizer_at, chaos_trace, net_delay or None)
        return run_from_cli(config, threads, given, sky, chaos_given, sync_host, term_grace, max_restarts, as_json)
    if options.plain(backend)[0] == "slurm":
        from ._slurm import run_from_cli as run_slurm_from_cli

        chaos_given = (learner_mtbf, straggle, kill_synchronizer_at, chaos_trace, net_delay or None)
        return run_slurm_from_cli(config, threads, slurm_flags, chaos_given, dry_run, detach, as_json, make_sinks)

    from ._local import run_locally

    run_locally(
        config,
        task,
        hosts=hosts,
        method=method,
        quiet=quiet,
        eval_every=eval_every,
        as_json=as_json,
        make_sinks=make_sinks,
        dashboard=(dashboard_host, dashboard_port) if dashboard else None,
    )
