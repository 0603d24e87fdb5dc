"""`ddiloco run --method ddp|elastic-ddp`: the data-parallel baselines (`ddiloco.dataparallel`) with
`ddiloco run`'s flags, its summary table and its --json line (docs/dataparallel.md); with
`--backend slurm`, each worker a Slurm job (`dataparallel.slurm`, `cluster.dataparallel_jobs`)."""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ..chaos.injector import ChaosSettings


def run_baseline(
    *,
    method: str,
    model: str,
    model_size: str,
    data: str | None,
    seq_len: int,
    learners: int,
    batch_size: int,
    inner_lr: float,
    seed: int,
    tokens: int | None,
    duration: float | None,
    sync_every: int,
    min_step_seconds: float,
    eval_batches: int,
    eval_every: float,
    threads: int,
    chaos: ChaosSettings,
    net: tuple[float, float, float] = (0.0, 0.0, 0.0),
    run_dir: Path | None,
    as_json: bool,
    slurm: dict[str, Any] | None = None,
    make_sinks: Callable[[Path, object], list] | None = None,
) -> None:
    """Run the baseline to its budget; exit 1 when it did not finish. `slurm`: `SlurmOptions`' fields
    (`host`: where workers reach the launcher's store) to run each worker as a Slurm job; `make_sinks`:
    (run directory, config) -> the metric sinks the flags ask for."""
    from ..dataparallel.config import DataParallelConfig
    from ..dataparallel.launcher import Launcher
    from ..dataparallel.run import run_data_parallel
    from . import options
    from .output import print_summary, stderr, user_error

    config = DataParallelConfig(
        run_dir=run_dir or Path("runs") / time.strftime("run-%Y%m%d-%H%M%S"),
        method=method,
        model=model,
        model_size=model_size,
        data=data,
        seq_len=seq_len,
        workers=learners,
        batch_size=batch_size,
        inner_lr=inner_lr,
        seed=seed,
        tokens=tokens if tokens is not None or duration is not None else 400_000,
        duration=duration,
        checkpoint_every=sync_every,  # as often as a learner saves its inner optimizer state
        min_step_seconds=min_step_seconds,
        learner_down=chaos.learner_down,
        eval_batches=eval_batches,
        eval_every=eval_every,
        threads=options.shared_threads(threads, learners),
        chaos=chaos,
        net_latency=net[0],  # the all-reduce pays the emulated link (dataparallel/link.py)
        net_bandwidth=net[1],
        net_jitter=net[2],
    )
    factory: Callable[[DataParallelConfig], Launcher] = Launcher
    if slurm is not None:
        try:
            factory = slurm_launcher(slurm, chaos)
        except ValueError as exc:
            raise user_error(exc) from None
    sinks = make_sinks(config.run_dir, config) if make_sinks is not None else []
    result = run_data_parallel(config, factory, sinks)
    print_summary(result, title=f"ddiloco run --method {method}" + (" --backend slurm" if slurm else ""))
    if result["error"]:
        stderr.print(f"[red]error:[/red] {result['error']}")
    if as_json:
        print(json.dumps(result, sort_keys=True), flush=True)
    if result["error"]:
        sys.exit(1)


def slurm_launcher(flags: dict[str, Any], chaos: ChaosSettings) -> Callable[..., Any]:
    """The launcher factory of a data-parallel run on Slurm; refuses what has no meaning there."""
    from ..cluster.dataparallel_jobs import WorkerJobs, store_host, write_worker_scripts
    from ..cluster.sbatch import SlurmOptions
    from ..dataparallel.config import DataParallelConfig
    from ..dataparallel.slurm import SlurmLauncher
    from ._slurm import check_local_only

    check_local_only(learner_mtbf=chaos.learner_mtbf, straggle=chaos.straggle, chaos_trace=chaos.trace, net_delay=None)
    opts = SlurmOptions(**flags)
    if opts.nodes_per_learner != 1 or opts.procs_per_node != 1 or opts.learner_state != "shared":
        raise ValueError(
            "--nodes-per-learner, --procs-per-node, --learner-state: not for ddp/elastic-ddp (one rank per job)"
        )
    host = store_host(opts.host)

    def factory(config: DataParallelConfig) -> SlurmLauncher:
        def table(argvs: dict[int, list[str]]) -> WorkerJobs:
            return WorkerJobs(config.run_dir, write_worker_scripts(config.run_dir, argvs, opts))

        return SlurmLauncher(config, table, host)

    return factory
