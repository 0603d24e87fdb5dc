"""`ddiloco run`: the synchronizer and M learner processes on this machine, supervised, with chaos; as
Slurm jobs or SkyPilot tasks (`--backend`); or the data-parallel baselines (`--method ddp|elastic-ddp`).

`run` checks the flags (`_run_flags`), builds the run's config from them (`launch.config.RunConfig`,
or `dataparallel.config.DataParallelConfig` for the baselines), hands it to the backend they chose
(`ddiloco.backends`) and prints what the run left."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from . import app, options
from ._flags import takes
from ._run_flags import RunCommand, RunFlags
from .output import user_error
from .run_options import SLURM_ONLY_ALLOWED, check_backend_flags, hosts_plan, kill_shard_list

if TYPE_CHECKING:
    from ..backends.base import Backend, Output
    from ..chaos.injector import ChaosSettings
    from ..dataparallel.config import DataParallelConfig
    from ..hosts.run import HostsPlan
    from ..launch.config import RunConfig
    from ..train.tasks import Task

DATA_PARALLEL = ("ddp", "elastic-ddp")


@app.command("run", cls=RunCommand)
@takes(RunFlags)
def run(flags: RunFlags) -> None:
    """Train with real processes and real sockets, inject faults, report goodput, stalls and loss."""
    from ..backends.base import Refused, launch_and_follow
    from ..records import logsetup
    from ..train.tasks import make_task
    from .output import TerminalOutput, finish, refused

    method, backend_name = options.plain(flags.method, flags.backend)
    given = _checked(flags)
    logsetup.configure("run", "warning")
    try:  # before anything is built: a bad --link or a machine that cannot make hosts fails at once
        emulated = flags.net_latency or flags.net_bandwidth or flags.net_jitter
        shards = 0 if method in DATA_PARALLEL else flags.sync_shards  # the data-parallel workers have no shards
        hosts = hosts_plan(options.plain(flags.network)[0], flags.link, flags.learners, shards, emulated)
    except ValueError as exc:
        raise user_error(exc) from None
    config: RunConfig | DataParallelConfig
    try:
        chaos = _chaos(flags)
        model, model_size = options.plain(flags.model, flags.model_size)
        task = make_task(model, flags.data, seq_len=flags.seq_len, model_size=model_size)
        # the data-parallel baselines have a config (and a launcher) of their own
        config = _dataparallel_config(flags, chaos) if method in DATA_PARALLEL else _run_config(flags, task, chaos)
    except (ValueError, FileNotFoundError, NotADirectoryError) as exc:
        raise user_error(exc) from None
    backend = _backend(flags, given, config.chaos, task, hosts, TerminalOutput(live=not flags.quiet))
    try:
        report = launch_and_follow(backend, config)
    except Refused as exc:
        raise refused(exc) from None
    title = f"ddiloco run --method {method}" + ("" if backend_name == "local" else f" --backend {backend_name}")
    finish(report, title, flags.as_json)


def _checked(flags: RunFlags) -> list[str]:
    """Refuse the flags that do not go together; returns the Slurm-only flags given (`check_backend_flags`)."""
    method, backend, network = options.plain(flags.method, flags.backend, flags.network)
    if network == "hosts" and backend != "local":
        raise user_error(ValueError("--network hosts: with --backend local only"))
    sinks = flags.tensorboard is not None or flags.wandb
    f = flags
    sky_given = bool(f.store or f.infra or f.accelerators or not f.spot or f.tls is not None or f.sky_port != 7070)
    try:
        return check_backend_flags(backend, _slurm_flags(flags), flags.dry_run, flags.detach, sky_given, sinks)
    except ValueError as exc:
        raise user_error(exc) from None


def _slurm_flags(flags: RunFlags) -> dict[str, Any]:
    """`cluster.sbatch.SlurmOptions`' fields, for both launchers on Slurm."""
    return {
        "partition": flags.partition,
        "account": flags.account,
        "time_limit": flags.time_limit,
        "nodes_per_learner": flags.nodes_per_learner,
        "procs_per_node": flags.procs_per_node,
        "gpus_per_node": flags.gpus_per_node,
        "cpus_per_task": flags.cpus_per_task,
        "host": flags.sync_host,
        "term_grace": flags.term_grace,
        "extra": tuple(flags.sbatch_arg or ()),
        "max_restarts": flags.max_restarts,
        "learner_state": options.plain(flags.learner_state)[0],
    }


def _sinks(flags: RunFlags) -> Callable[[Path, object], list]:
    """(run directory, config) -> the metric sinks the flags ask for (none without --tensorboard, --wandb)."""

    def make(where: Path, config: object) -> list:
        from ..records.rundir import jsonable
        from .output import metric_sinks

        return metric_sinks(
            flags.tensorboard, flags.wandb, flags.wandb_mode, flags.wandb_project, where, where.name, jsonable(config)
        )

    return make


def _chaos(flags: RunFlags) -> ChaosSettings:
    from ..chaos.injector import ChaosSettings
    from ..chaos.trace import FailureTrace

    trace = FailureTrace.load(flags.chaos_trace) if flags.chaos_trace is not None else None
    chaos = ChaosSettings(
        learner_mtbf=flags.learner_mtbf,
        learner_down=flags.learner_down,
        straggle=flags.straggle,
        straggle_every=flags.straggle_every,
        kill_synchronizer_at=flags.kill_synchronizer_at,
        synchronizer_down=flags.synchronizer_down,
        kill_shards=kill_shard_list(flags.kill_shards, flags.sync_shards),
        kill_every=flags.kill_every,
        net_delay_ms=flags.net_delay,
        trace=trace,
        seed=flags.seed,
    )
    if trace is not None and any(o.learner >= flags.learners for o in trace.outages):
        raise ValueError(f"{flags.chaos_trace} names learners beyond 0..{flags.learners - 1}")
    return chaos


def _run_dir(flags: RunFlags) -> Path:
    return flags.run_dir or Path("runs") / time.strftime("run-%Y%m%d-%H%M%S")


def _tokens(flags: RunFlags) -> int | None:
    """--tokens, or 400000 when neither --tokens nor --duration is given."""
    return flags.tokens if flags.tokens is not None or flags.duration is not None else 400_000


def _run_config(flags: RunFlags, task: Task, chaos: ChaosSettings) -> RunConfig:
    """The run's config (its directory made), for a local, Slurm or SkyPilot run."""
    from ..api.model import fit_fragments
    from ..launch.config import NetworkConfig, RunConfig
    from ..learner.wan import LinkConfig
    from ..wire import auth
    from .synchronizer import algorithm_for

    method, model, model_size, merge, backend = options.plain(
        flags.method, flags.model, flags.model_size, flags.merge, flags.backend
    )
    if options.plain(flags.allreduce_precision)[0] != "bf16":
        raise ValueError("--allreduce-precision: for --method ddp or elastic-ddp (there is no all-reduce here)")
    fragments = fit_fragments(len(list(task.build_model(flags.seed).parameters())), flags.fragments, flags.sync_every)
    config = RunConfig(
        run_dir=_run_dir(flags),
        method=method,
        model=model,
        model_size=model_size,
        data=flags.data,
        seq_len=flags.seq_len,
        shard_layout=options.ShardLayout(flags.shard_layout).value,
        learners=flags.learners,
        # what the run's synchronizers run (`RunConfig.synchronizer_settings`); a bad value is this command's error
        algorithm=algorithm_for(
            method, flags.learners, fragments=fragments, merge=merge, **options.algorithm_knobs(flags)
        ),
        inner=options.inner_config(flags),
        seed=flags.seed,
        tokens=_tokens(flags),
        duration=flags.duration,
        sync_shards=flags.sync_shards,
        network=NetworkConfig(
            link=LinkConfig(flags.net_latency, flags.net_bandwidth, flags.net_jitter),
            codec=options.Codec(flags.codec).value,
            codec_down=options.CodecDown(flags.codec_down).value,
            bulk_socket=flags.bulk_socket,
            min_bandwidth=flags.min_bandwidth,
        ),
        heartbeat=flags.heartbeat,
        checkpoint_every=flags.checkpoint_every,
        # on a cluster each process has its node: --threads as given (0: PyTorch's default)
        threads=options.shared_threads(flags.threads, flags.learners + flags.sync_shards)
        if backend == "local"
        else flags.threads,
        min_step_seconds=flags.min_step_seconds,
        eval_batches=flags.eval_batches,
        eval_every=flags.eval_every,
        token=auth.resolve_token(flags.token),
        peer_recovery=flags.peer_recovery,
        orphan_timeout=flags.orphan_timeout,
        chaos=chaos,
    )
    try:
        config.run_dir.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise ValueError(f"--run-dir {config.run_dir}: cannot create it ({exc.strerror})") from None
    return config


def _dataparallel_config(flags: RunFlags, chaos: ChaosSettings) -> DataParallelConfig:
    """A data-parallel baseline's config, from the flags that have a meaning for it."""
    from ..dataparallel.config import DataParallelConfig
    from ..learner.wan import LinkConfig

    method, model, model_size, backend = options.plain(flags.method, flags.model, flags.model_size, flags.backend)
    if backend not in ("local", "slurm") or flags.kill_synchronizer_at is not None:
        raise ValueError(f"--method {method}: local or slurm backend, and there is no synchronizer to kill")
    if backend == "slurm" and (flags.dry_run or flags.detach):
        raise ValueError(f"--method {method} on slurm: the launcher holds the store; no --dry-run, --detach")
    if flags.net_delay:
        raise ValueError(f"--method {method}: --net-delay is not emulated here; use --net-latency")
    return DataParallelConfig(
        run_dir=_run_dir(flags),
        method=method,
        model=model,
        model_size=model_size,
        data=flags.data,
        seq_len=flags.seq_len,
        shard_layout=options.ShardLayout(flags.shard_layout).value,
        workers=flags.learners,
        inner=options.inner_config(flags),
        seed=flags.seed,
        tokens=_tokens(flags),
        duration=flags.duration,
        checkpoint_every=flags.sync_every,  # as often as a learner saves its inner optimizer state
        min_step_seconds=flags.min_step_seconds,
        learner_down=chaos.learner_down,
        eval_batches=flags.eval_batches,
        eval_every=flags.eval_every,
        threads=options.shared_threads(flags.threads, flags.learners),
        chaos=chaos,
        link=LinkConfig(flags.net_latency, flags.net_bandwidth, flags.net_jitter),  # the all-reduce pays it
        allreduce_precision=options.plain(flags.allreduce_precision)[0],
    )


def _backend(
    flags: RunFlags, given: list[str], chaos: ChaosSettings, task: Task, hosts: HostsPlan | None, output: Output
) -> Backend[Any]:
    """The backend `--backend` (and `--method`) name, with its own options from the flags; what the user
    asked wrong is refused here, before anything runs."""
    from ..backends.base import check_local_only

    method, backend = options.plain(flags.method, flags.backend)
    if method in DATA_PARALLEL:
        from ..backends.dataparallel import DataParallelBackend

        slurm = _slurm_flags(flags) if backend == "slurm" else None
        return DataParallelBackend(output, slurm, _sinks(flags), hosts)
    if backend == "local":
        from ..backends.local import LocalBackend, LocalOptions

        dashboard = (flags.dashboard_host, flags.dashboard_port) if flags.dashboard else None
        return LocalBackend(output, LocalOptions(hosts, dashboard, _sinks(flags)), task)
    try:
        if backend == "skypilot":
            wrong = [flag for flag in given if flag not in SLURM_ONLY_ALLOWED]
            if wrong:
                raise ValueError(f"{', '.join(wrong)}: only with --backend slurm")
        check_local_only(chaos)
        if backend == "slurm":
            from ..backends.slurm import SlurmBackend
            from ..cluster.sbatch import SlurmOptions

            opts = SlurmOptions(**_slurm_flags(flags))
            return SlurmBackend(output, opts, dry_run=flags.dry_run, detach=flags.detach, sinks=_sinks(flags))
        from ..backends.skypilot import SkyPilotBackend, sky_options

        sky = sky_options(
            flags.learners,
            flags.store,
            flags.infra,
            flags.accelerators,
            spot=flags.spot,
            tls=flags.tls,
            port=flags.sky_port,
            host=flags.sync_host,
            term_grace=flags.term_grace,
            max_restarts=flags.max_restarts,
        )
        return SkyPilotBackend(output, sky, dry_run=flags.dry_run, detach=flags.detach)
    except ValueError as exc:
        raise user_error(exc) from None
