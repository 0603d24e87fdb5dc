"""The Slurm jobs of a data-parallel baseline (`ddiloco run --method ddp|elastic-ddp --backend slurm`):
one requeueable job per worker, its script, and a table the data-parallel launcher drives as it
drives local processes (`dataparallel/slurm.py`).

Why one job per worker and not one job of M tasks: Slurm requeues, cancels and reschedules a job as
a whole. `elastic-ddp` needs a preempted worker to come back on its own while the others go on, so
each worker is a job of its own (as each ddiloco learner is, `cluster/sbatch.py`). `ddp` gets the
semantics of one job of M tasks requeued as a whole from the launcher: when one worker's job is
preempted, it requeues every other worker's job, so all M start again and resume from the
checkpoint, which is what a torchrun job under a requeueing scheduler does. Both methods then share
one shape, one script and one launcher.

A job's *incarnation* is Slurm's restart count (`SLURM_RESTART_COUNT`, `squeue -O RestartCnt`): it
grows at every requeue, at once. The worker says hello with it, so the launcher never takes an
earlier start of a job for the one it waits for, and a count above the one it waits for means Slurm
requeued (preempted) the job: that incarnation is dead. Every Slurm call is bounded; squeue is asked
at most once per `POLL` seconds, for all jobs at once.
"""

from __future__ import annotations

import contextlib
import json
import shlex
import socket
import time
from dataclasses import dataclass
from pathlib import Path

from ..records.atomic import atomic_write
from . import slurm
from .sbatch import SlurmOptions, _command, _header

POLL = 1.0
INCARNATION = "__DDILOCO_INCARNATION__"  # replaced by the job's restart count in the script
ENDED = slurm.FINISHED | {"GONE", "REQUEUE_FED", "SPECIAL_EXIT"}


def store_host(host: str) -> str:
    """The address workers reach the launcher's store at: `--sync-host`, or for `auto` this host's
    first non-loopback IPv4 address (127.0.0.1 when it has none). No host name is resolved."""
    if host != "auto":
        return host
    with contextlib.suppress(OSError), socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.connect(("192.0.2.1", 9))  # TEST-NET-1: nothing is sent; the kernel picks the source address
        address = str(s.getsockname()[0])
        if not address.startswith("127."):
            return address
    return "127.0.0.1"


def worker_script(name: str, out: Path, argv: list[str], opts: SlurmOptions) -> str:
    """A requeueable job that runs one worker; `INCARNATION` in argv becomes its restart count."""
    command = _command(argv).replace(shlex.quote(INCARNATION), '"${SLURM_RESTART_COUNT:-0}"')
    return (
        "\n".join(
            [
                *_header(name, out.resolve(), opts, 1, True, opts.gpus_per_node),
                'echo "worker job $SLURM_JOB_ID start ${SLURM_RESTART_COUNT:-0} on $(hostname) at $(date +%T)" >&2',
                f"exec srun --ntasks=1 {command}",
            ]
        )
        + "\n"
    )


def write_worker_scripts(run_dir: Path, argvs: dict[int, list[str]], opts: SlurmOptions) -> dict[int, Path]:
    """RUN_DIR/slurm/workerM.sbatch for every worker (its output in RUN_DIR/learner-M/)."""
    out = run_dir / "slurm"
    out.mkdir(parents=True, exist_ok=True)
    paths = {}
    for m, argv in argvs.items():
        folder = run_dir / f"learner-{m}"
        folder.mkdir(parents=True, exist_ok=True)
        path = out / f"worker{m}.sbatch"
        path.write_text(worker_script(f"ddiloco-{run_dir.name}-worker{m}", folder, argv, opts))
        path.chmod(0o755)
        paths[m] = path
    return paths


@dataclass
class WorkerJob:
    """One worker's job, shaped as a local worker process (`launch.procs.Child`) for the launcher."""

    slot: int
    job: str
    expected: int = 0  # the incarnation the launcher waits for or runs
    state: str = "PENDING"  # Slurm's, as last seen
    restarts: int = 0  # Slurm's restart count, as last seen
    pid: int = 0  # the expected incarnation's worker process, once it said hello (0 before)

    def alive(self) -> bool:
        """Queued or running, as the incarnation the launcher waits for (a higher count: preempted)."""
        return self.restarts <= self.expected and self.state not in ENDED

    def running(self) -> bool:
        return self.state == "RUNNING" and self.restarts == self.expected

    def poll(self) -> int | None:
        """None while alive; 0 when it completed (the run is over), -15 when requeued, else 1."""
        if self.alive():
            return None
        if self.restarts > self.expected:
            return -15
        return 0 if self.state == "COMPLETED" else 1

    def signal(self, sig: int) -> bool:
        return False  # no signals from the launcher's host: chaos on Slurm is `scontrol requeue`


class WorkerJobs:
    """Submits, watches, requeues and cancels the workers' jobs; the launcher's process table."""

    def __init__(self, run_dir: Path, scripts: dict[int, Path], poll: float = POLL) -> None:
        self.run_dir = run_dir
        (run_dir / "slurm").mkdir(parents=True, exist_ok=True)  # jobs.json goes there
        self.scripts = scripts
        self.poll = poll
        self.jobs: dict[int, WorkerJob] = {}
        self._seen = 0.0

    def _record(self) -> None:
        roles = {f"worker{m}": j.job for m, j in sorted(self.jobs.items())}
        atomic_write(slurm.jobs_file(self.run_dir), json.dumps(roles, indent=1).encode())

    def submit(self, slot: int) -> WorkerJob:
        """Worker `slot`'s job (every worker's submitted at the first call, in one go)."""
        if not self.jobs:
            ids = slurm.submit(self.run_dir, {f"worker{m}": p for m, p in self.scripts.items()})
            self.jobs = {m: WorkerJob(m, ids[f"worker{m}"]) for m in self.scripts}
        return self.jobs[slot]

    def refresh(self, force: bool = False) -> None:
        """States and restart counts of every job, from one squeue (at most every `poll` seconds)."""
        if not self.jobs or not force and time.monotonic() - self._seen < self.poll:
            return
        self._seen = time.monotonic()
        ids = ",".join(j.job for j in self.jobs.values())
        try:
            out = slurm._run(["squeue", "-h", "-t", "all", "-O", "JobID:24,State:24,RestartCnt:12", "-j", ids])
        except slurm.SlurmError as exc:
            if "Invalid job id" not in str(exc):
                raise
            out = ""
        seen = {f[0]: (f[1], int(f[2])) for f in (line.split() for line in out.splitlines()) if len(f) >= 3}
        for job in self.jobs.values():
            job.state, restarts = seen.get(job.job, ("GONE", job.restarts))
            job.restarts = max(job.restarts, restarts)

    def restart(self, job: WorkerJob) -> None:
        """Start the worker again: take the incarnation Slurm already queued (a preemption), requeue an
        ended job, or submit a new one when Slurm forgot it; a queued or running one is left alone."""
        self.refresh(force=True)
        if job.restarts > job.expected:
            job.expected, job.pid = job.restarts, 0
        elif job.state in ENDED:
            try:
                slurm.requeue(job.job)
                job.expected, job.pid, job.state = job.restarts + 1, 0, "PENDING"
            except slurm.SlurmError:
                ids = slurm.submit(self.run_dir, {f"worker{job.slot}": self.scripts[job.slot]})
                job.job, job.expected, job.restarts, job.pid, job.state = ids[f"worker{job.slot}"], 0, 0, 0, "PENDING"
                self._record()

    def kill_tree(self, job: WorkerJob) -> None:
        """ddp's whole-job restart: requeue a running worker's job (SIGTERM, queued again); one that is
        queued, or whose requeue is under way, starts anew by itself."""
        self.refresh(force=True)
        if job.restarts > job.expected:
            job.expected, job.pid = job.restarts, 0
        elif job.state not in ENDED and job.state != "PENDING":
            with contextlib.suppress(slurm.SlurmError):  # it left RUNNING meanwhile: it restarts anyway
                slurm.requeue(job.job)
                job.expected, job.pid, job.restarts = job.restarts + 1, 0, job.restarts + 1

    def cancel_pending(self) -> None:
        """Once the run is over, a worker still queued is not needed: cancel it."""
        pending = {f"worker{m}": j.job for m, j in self.jobs.items() if j.state == "PENDING"}
        if pending:
            with contextlib.suppress(slurm.SlurmError):
                slurm.cancel(pending)
            for m in self.jobs:
                if f"worker{m}" in pending:
                    self.jobs[m].state = "CANCELLED"

    def stop_all(self, grace: float = 5.0) -> None:
        """Let running workers end by themselves (bounded by `grace`), then scancel what is left."""
        deadline = time.monotonic() + grace
        while self.jobs and time.monotonic() < deadline:
            self.refresh(force=True)
            self.cancel_pending()
            if all(j.state in ENDED for j in self.jobs.values()):
                return
            time.sleep(self.poll)
        self.refresh(force=True)
        live = {f"worker{m}": j.job for m, j in self.jobs.items() if j.state not in ENDED}
        with contextlib.suppress(slurm.SlurmError):
            slurm.cancel(live)
