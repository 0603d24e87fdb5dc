"""`ddiloco run --method ddp|elastic-ddp`: the data-parallel baselines (`ddiloco.dataparallel`) with
`ddiloco run`'s summary and --json line (docs/dataparallel.md); with `slurm` options, each worker a
Slurm job (`dataparallel.slurm`, `cluster.dataparallel_jobs`).

Its config is a `dataparallel.config.DataParallelConfig`. `launch` decides where the workers go
(refusing what has no meaning there) and makes the metric sinks; `follow` runs the baseline to its
budget, from start to summary (`dataparallel.run`: the launcher holds the workers' store, so it
cannot be left running)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from ..chaos.injector import ChaosSettings
from ..dataparallel.config import DataParallelConfig
from .base import Launched, Output, Refused, Report, check_local_only, refusing

# A data-parallel run's mistakes that are the user's (exit code 2), as for the flags that made its config.
USER_ERRORS = (ValueError, FileNotFoundError, NotADirectoryError)


class DataParallelBackend:
    """The baselines' workers as local processes, or (`slurm`: `cluster.sbatch.SlurmOptions`' fields;
    `host`: where workers reach the launcher's store) as Slurm jobs; `sinks`: (run directory, config)
    -> the metric sinks the flags ask for."""

    name = "dataparallel"

    def __init__(
        self,
        output: Output,
        slurm: dict[str, Any] | None = None,
        sinks: Callable[[Path, object], list] | None = None,
    ) -> None:
        self.output, self.slurm, self.sinks = output, slurm, sinks

    def launch(self, config: DataParallelConfig) -> Launched:
        from ..dataparallel.launcher import Launcher

        with refusing(*USER_ERRORS):
            factory: Callable[[DataParallelConfig], Any] = Launcher
            if self.slurm is not None:
                factory = slurm_launcher(self.slurm, config.chaos)
        sinks = self.sinks(config.run_dir, config) if self.sinks is not None else []
        return Launched(
            {"backend": "slurm" if self.slurm else "local", "run_dir": str(config.run_dir)},
            handle=(config, factory, sinks),
        )

    def follow(self, launched: Launched) -> Report:
        from ..dataparallel.run import run_data_parallel

        config, factory, sinks = launched.handle
        with refusing(*USER_ERRORS):
            result = run_data_parallel(config, factory, sinks)
        return Report(result, table=result, error=result["error"])

    def stop(self, run_dir: Path) -> dict:
        raise Refused(
            f"{run_dir}: a data-parallel run is stopped by the `ddiloco run` that started it (Ctrl-C, or SIGTERM "
            "to that process): it holds the workers' store"
        )


def slurm_launcher(flags: dict[str, Any], chaos: ChaosSettings) -> Callable[..., Any]:
    """The launcher factory of a data-parallel run on Slurm; refuses what has no meaning there."""
    from ..cluster.dataparallel_jobs import WorkerJobs, store_host, write_worker_scripts
    from ..cluster.sbatch import SlurmOptions
    from ..dataparallel.slurm import SlurmLauncher

    check_local_only(chaos)
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
