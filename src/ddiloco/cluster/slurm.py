"""Submitting, watching and ending a run's Slurm jobs, through Slurm's own commands.

The job IDs go to RUN_DIR/slurm/jobs.json as soon as they exist, so that `ddiloco slurm-stop` (or
`scancel`) can end a run whose launcher is gone. Every call is bounded in time; a Slurm command that
fails raises `SlurmError` with its own message.
"""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

from ..records.atomic import atomic_write

COMMAND_TIMEOUT = 60.0
FINISHED = {
    "COMPLETED",
    "FAILED",
    "CANCELLED",
    "TIMEOUT",
    "OUT_OF_MEMORY",
    "NODE_FAIL",
    "BOOT_FAIL",
    "DEADLINE",
    "PREEMPTED",
}


class SlurmError(RuntimeError):
    pass


def _run(args: list[str], timeout: float = COMMAND_TIMEOUT) -> str:
    if shutil.which(args[0]) is None:
        raise SlurmError(f"{args[0]} not found: this machine is not a Slurm submit host (or use --dry-run)")
    try:
        done = subprocess.run(args, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        raise SlurmError(f"{' '.join(args[:2])} did not answer within {timeout:.0f} s") from None
    if done.returncode != 0:
        raise SlurmError(f"{' '.join(args[:2])} failed: {done.stderr.strip() or done.stdout.strip()}")
    return done.stdout


def shard_addresses(run_dir: Path, shards: int) -> list[str] | None:
    """Every shard's address from its address file (read again at each call: a requeued shard writes
    a new one), or None while one is missing."""
    files = [run_dir / f"sync-{s}" / "address" for s in range(shards)]
    texts = [f.read_text().strip() if f.is_file() else "" for f in files]
    return texts if all(texts) else None


def jobs_file(run_dir: Path) -> Path:
    return run_dir / "slurm" / "jobs.json"


def read_jobs(run_dir: Path) -> dict[str, str]:
    path = jobs_file(run_dir)
    if not path.is_file():
        raise FileNotFoundError(f"{path}: no Slurm jobs recorded for this run directory")
    jobs = json.loads(path.read_text())
    if not isinstance(jobs, dict) or not all(isinstance(v, str) and v.isdigit() for v in jobs.values()):
        raise ValueError(f"{path} is not a jobs file written by ddiloco")
    return jobs


def submit(run_dir: Path, scripts: dict[str, Path]) -> dict[str, str]:
    """sbatch every script (synchronizer shards first); returns role -> job ID. A failure cancels what
    was already submitted, so no half-run is left queued."""
    jobs: dict[str, str] = {}
    try:
        for role in sorted(scripts, key=lambda r: (not r.startswith("sync"), r)):
            out = _run(["sbatch", "--parsable", str(scripts[role])])
            jobs[role] = out.strip().split(";")[0]
            atomic_write(jobs_file(run_dir), json.dumps(jobs, indent=1).encode())
    except SlurmError:
        cancel(jobs)
        raise
    return jobs


def cancel(jobs: dict[str, str], signal: str | None = None) -> None:
    """scancel the run's jobs (all with one call); with `signal`, only signal them."""
    if not jobs:
        return
    args = ["scancel", *([f"--signal={signal}", "--full"] if signal else []), *jobs.values()]
    _run(args)


def requeue(job: str, hold: bool = False) -> None:
    """What a preemption does to a requeueable job: stop it (SIGTERM, then SIGKILL) and queue it again;
    `hold`: held in the queue until `release` (a preemption whose capacity comes back later)."""
    _run(["scontrol", "requeuehold" if hold else "requeue", job])


def release(job: str) -> None:
    """Let a held job start again (`requeue(job, hold=True)`)."""
    _run(["scontrol", "release", job])


def states(jobs: dict[str, str]) -> dict[str, str]:
    """role -> Slurm state (PENDING, RUNNING, ...), "GONE" for a job squeue no longer knows."""
    if not jobs:
        return {}
    try:
        out = _run(["squeue", "-h", "-o", "%i %T", "-j", ",".join(jobs.values())])
    except SlurmError as exc:
        if "Invalid job id" not in str(exc):
            raise
        out = ""  # every job has left squeue's memory
    by_id = dict(line.split()[:2] for line in out.splitlines() if len(line.split()) >= 2)
    return {role: by_id.get(job, "GONE") for role, job in jobs.items()}
