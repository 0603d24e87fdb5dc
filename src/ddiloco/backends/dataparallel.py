"""`ddiloco run --method ddp|elastic-ddp`: the data-parallel baselines (`ddiloco.dataparallel`) with
`ddiloco run`'s summary and --json line (docs/dataparallel.md); with `slurm` options, each worker a
Slurm job (`dataparallel.slurm`, `cluster.dataparallel_jobs`); with a network of hosts (`--network
hosts`, `hosts.run`), each worker on a host of its own behind a kernel-shaped link (`hosted_launcher`).

Its config is a `dataparallel.config.DataParallelConfig`. `launch` decides where the workers go
(refusing what has no meaning there) and makes the metric sinks; `follow` runs the baseline to its
budget, from start to summary (`dataparallel.run`: the launcher holds the workers' store, so it
cannot be left running)."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..chaos.injector import ChaosSettings
from ..dataparallel.config import DataParallelConfig
from .base import Launched, Output, Refused, Report, check_local_only, refusing

if TYPE_CHECKING:
    from ..hosts.run import HostsPlan, HostsRun

# A data-parallel run's mistakes that are the user's (exit code 2), as for the flags that made its config.
USER_ERRORS = (ValueError, FileNotFoundError, NotADirectoryError)


class DataParallelBackend:
    """The baselines' workers as local processes, or (`slurm`: `cluster.sbatch.SlurmOptions`' fields;
    `host`: where workers reach the launcher's store) as Slurm jobs; `sinks`: (run directory, config)
    -> the metric sinks the flags ask for; `hosts`: the network of hosts the workers run on (local only)."""

    name = "dataparallel"

    def __init__(
        self,
        output: Output,
        slurm: dict[str, Any] | None = None,
        sinks: Callable[[Path, object], list] | None = None,
        hosts: HostsPlan | None = None,
    ) -> None:
        self.output, self.slurm, self.sinks, self.hosts = output, slurm, sinks, hosts
        if hosts is not None and slurm is not None:
            raise ValueError("--network hosts: with --backend local only")

    def launch(self, config: DataParallelConfig) -> Launched:
        from ..dataparallel.launcher import Launcher

        with refusing(*USER_ERRORS):
            factory: Callable[[DataParallelConfig], Any] = Launcher
            if self.slurm is not None:
                factory = slurm_launcher(self.slurm, config.chaos)
        network = self._hosts(config.run_dir) if self.hosts is not None else None
        try:
            if network is not None:
                factory = hosted_launcher(network)
            sinks = self.sinks(config.run_dir, config) if self.sinks is not None else []
        except BaseException:
            if network is not None:
                network.close()
            raise
        return Launched(
            {"backend": "slurm" if self.slurm else "local", "run_dir": str(config.run_dir)},
            handle=(config, factory, sinks, network),
        )

    def _hosts(self, run_dir: Path) -> HostsRun:
        from ..hosts import HostsUnavailable
        from ..hosts.run import HostsRun, describe

        assert self.hosts is not None
        try:
            network = HostsRun(self.hosts, run_dir)
        except HostsUnavailable as exc:
            raise Refused(str(exc), flag="--network hosts") from None
        lines = "\n  ".join(describe(network.hosts(False)))
        self.output.show(f"hosts (links measured before the run):\n  {lines}")
        return network

    def follow(self, launched: Launched) -> Report:
        from ..dataparallel.run import run_data_parallel

        config, factory, sinks, network = launched.handle
        with contextlib.ExitStack() as closing:  # the hosts, when there are: removed once the run is summarized
            if network is not None:
                closing.callback(network.close)
                network.enter()  # the launcher's store (and its connections) on the launcher's host
            try:
                with refusing(*USER_ERRORS):
                    result = run_data_parallel(config, factory, sinks)
            finally:
                if network is not None:
                    network.leave()
            if network is not None:
                self._network_report(network, config, result)
        return Report(result, table=result, error=result["error"])

    def _network_report(self, network: HostsRun, config: DataParallelConfig, result: dict) -> None:
        """What each link carried, in the summary (written again) and on the terminal."""
        from ..hosts.run import describe
        from ..records.rundir import RunDir

        result["network"] = network.report()
        RunDir(config.run_dir).write_summary(result)
        lines = "\n  ".join(describe(result["network"]["hosts"]))
        self.output.show(f"links (what each carried):\n  {lines}")

    def stop(self, run_dir: Path) -> dict:
        raise Refused(
            f"{run_dir}: a data-parallel run is stopped by the `ddiloco run` that started it (Ctrl-C, or SIGTERM "
            "to that process): it holds the workers' store"
        )


def worker_host(child: str) -> str:
    """The host of data-parallel worker process `worker-M`: `learnerM` (`--link learnerM=SPEC` names it)."""
    prefix, _, slot = child.partition("-")
    if prefix != "worker" or not slot.isdigit():
        raise ValueError(f"not a data-parallel worker: {child!r}")
    return f"learner{slot}"


def hosted_launcher(network: HostsRun) -> Callable[[DataParallelConfig], Any]:
    """The launcher factory of a data-parallel run on a network of hosts: each worker on its host
    (`ip netns exec`); the store on the launcher's host's address alone (the factory is called with the
    main thread in that host, `HostsRun.enter`); gloo's sockets on each host's end of its own link. So
    the store's traffic and every all-reduce's cross the kernel-shaped links."""
    from ..dataparallel.launcher import Launcher
    from ..hosts.topology import HOST_DEV

    def wrap(child: str, argv: Sequence[str]) -> list[str]:
        return network.net.command(worker_host(child), argv)

    def factory(config: DataParallelConfig) -> Launcher:
        env = {**os.environ, "GLOO_SOCKET_IFNAME": HOST_DEV}
        launcher = Launcher(config, store_host=network.net.address("launcher"), env=env)
        launcher.procs.wrap = wrap
        return launcher

    return factory


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
