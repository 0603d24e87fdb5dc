"""The data-parallel launcher with Slurm jobs for workers (`ddiloco run --method ddp|elastic-ddp
--backend slurm`, docs/dataparallel.md).

Everything the local launcher decides stays as it is (`launcher.Launcher`: generations, `ddp`'s
whole-job restart, `elastic-ddp`'s regroup, the summary); only what a worker *is* changes. Each
worker is a requeueable Slurm job, and the launcher's process table is a table of jobs (built by
`cluster.dataparallel_jobs`, handed in by the CLI, so that this part imports nothing of the
cluster's):

    start       submit the job, requeue an ended one, or take the incarnation Slurm requeued
    alive       queued or running as the incarnation the launcher waits for (the job's restart count)
    ready       running, and this incarnation said hello in the store
    kill_tree   (ddp) requeue the job: the whole job starts again from the checkpoint

A preemption is `scontrol requeue` of a worker's job: its process gets SIGTERM and the restart count
grows at once, which the launcher sees at its next squeue. The store stays in the launcher, on the
submit host; workers reach it at `store_host` (`--sync-host`, 127.0.0.1 on a loopback cluster).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol

from .config import DataParallelConfig
from .launcher import Launcher, WorkerSlot

INCARNATION = "__DDILOCO_INCARNATION__"  # the job's restart count, filled in by its script


class Job(Protocol):
    """A worker's Slurm job as the launcher sees it (`cluster.dataparallel_jobs.WorkerJob`)."""

    job: str
    expected: int
    pid: int

    def alive(self) -> bool: ...
    def running(self) -> bool: ...
    def poll(self) -> int | None: ...
    def signal(self, sig: int) -> bool: ...


class JobTable(Protocol):
    """What the launcher asks of Slurm (`cluster.dataparallel_jobs.WorkerJobs`)."""

    def submit(self, slot: int) -> Any: ...  # a Job
    def refresh(self, force: bool = False) -> None: ...
    def restart(self, job: Any) -> None: ...
    def kill_tree(self, job: Any) -> None: ...
    def cancel_pending(self) -> None: ...
    def stop_all(self, grace: float = 5.0) -> None: ...


# (each worker's command line, by slot) -> the table that runs them as jobs
TableFactory = Callable[[dict[int, list[str]]], JobTable]


def worker_argv(
    config: DataParallelConfig,
    slot: int,
    store_host: str,
    store_port: int,
    origin: float,
    secret_file: Path | None = None,
) -> list[str]:
    """Worker `slot`'s command line in its job: the local one, plus where the store is and which
    incarnation of the job it runs in (the store's secret: a file on the shared run directory)."""
    argv = config.worker_command(slot, store_port, origin, secret_file)
    return [*argv, "--store-host", store_host, "--incarnation", INCARNATION]


def slurm_config(config: DataParallelConfig) -> DataParallelConfig:
    """On Slurm a worker is down as long as Slurm keeps its job queued, not `--learner-down`."""
    return dataclasses.replace(config, learner_down=0.0)


class SlurmLauncher(Launcher):
    backend = "slurm"

    def __init__(self, config: DataParallelConfig, table: TableFactory, store_host: str) -> None:
        super().__init__(slurm_config(config), store_host)  # the store listens on that one address
        self.store_host = store_host
        argvs = {
            m: worker_argv(self.config, m, store_host, self.coordinator.port, self.start_wall, self.secret_file)
            for m in range(self.config.workers)
        }
        self.jobs = table(argvs)
        self._checked = 0  # the last generation whose failure made the launcher ask Slurm again
        self._health: bool | None = None  # the generation's health while one decision is made
        self.procs = self.jobs  # type: ignore[assignment]  # kill_tree and stop_all, on jobs
        self._note("slurm", store=f"{store_host}:{self.coordinator.port}")

    def _start(self, slot: WorkerSlot) -> None:
        if slot.child is None:
            job = self.jobs.submit(slot.id)
        else:
            job = slot.child
            self.jobs.restart(job)
        slot.child = job
        slot.state, slot.restart_at, slot.started_at = "running", None, self.elapsed()
        self.events.write(
            "learner_started", learner=slot.id, pid=0, job=job.job, incarnation=job.expected, restarts=slot.restarts
        )

    def _running(self, slot: WorkerSlot) -> bool:
        """Not only queued: a job waiting for an allocation is not a stalled job (`_count_stall`)."""
        job: Job | None = slot.child  # type: ignore[assignment]
        return self._alive(slot) and job is not None and job.running()

    def _ready(self, slot: WorkerSlot) -> bool:
        """Running as the incarnation the launcher waits for, and that incarnation said hello."""
        job: Job | None = slot.child  # type: ignore[assignment]
        if slot.state != "running" or job is None or not job.running():
            return False
        pid, incarnation = self.coordinator.hello(slot.id)
        if pid is None or incarnation != job.expected:
            return False
        job.pid = pid  # the generation records it: a later incarnation (pid 0 until its hello) is another
        return True

    def _check_workers(self) -> None:
        self.jobs.refresh()
        if self.stopping:
            self.jobs.cancel_pending()
        super()._check_workers()

    def _decide(self) -> None:
        """A survivor may report the failed collective before the last squeue shows the requeue; ask
        Slurm again (once per generation) before regrouping, or the next generation would name the
        preempted worker, and the survivor would wait `--collective-timeout` for it to form."""
        generation = self.coordinator.generation
        for slot in self.slots:  # a new hello (a new process of a member) makes the generation unhealthy
            self._ready(slot)
        healthy = Launcher._healthy(self)
        if self.pids and self._checked != generation and not healthy:
            self._checked = generation
            self.jobs.refresh(force=True)
            super()._check_workers()
            healthy = Launcher._healthy(self)
        # One view of the generation's health for the whole decision: a failure reported between two
        # reads (a store's set is not acknowledged) would otherwise regroup without the fresh squeue.
        self._health = healthy
        try:
            super()._decide()
        finally:
            self._health = None

    def _healthy(self) -> bool:
        return super()._healthy() if self._health is None else self._health
