"""The preemptible scenario of benchmarks/time_to_loss.py on a real Slurm cluster.

Each method's run is `ddiloco run --backend slurm`, followed by its own launcher (which writes the
eval-loss curve, metrics.jsonl, and the summary as a local run does), while this module preempts its
learner jobs (ddiloco's `learnerM`, the data-parallel baselines' `workerM`) with `scontrol
requeuehold` on one schedule, offsets from each run's submission, and releases each after the
scenario's requeue wait (`scontrol release`), when Slurm starts it again. The schedule and the
requeues are chaos_slurm.py's (`schedule`, `requeue_due`, `release_due`), and so is the cluster: the
one `sinfo` reaches, else a private one on 127.0.0.1.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import chaos_slurm

POLL = 0.5
LAUNCHER_GRACE = 150.0  # a launcher interrupted with SIGINT stops its run cleanly within this


@contextlib.contextmanager
def slurm_or_local(choice: str | None, console) -> Iterator[tuple[dict | None, str]]:  # noqa: ANN001
    """(the Slurm commands' environment, or None for the local backend; why), for the scenario's
    note. `choice` None: Slurm when a cluster is reachable or a private one starts, else local."""
    if choice == "local":
        yield None, "local backend (--preemptible-backend local): kill -9, restart after the requeue wait"
        return
    try:
        private, env = chaos_slurm.cluster(console)
    except (SystemExit, RuntimeError, OSError, subprocess.SubprocessError) as exc:
        console.print(f"[yellow]no Slurm cluster ({exc}); the preemptible scenario runs on the local backend[/]")
        why = f"local backend: Slurm could not be had ({str(exc)[:200]}); kill -9, restart after the requeue wait"
        yield None, why
        return
    try:
        yield (
            env,
            (
                "Slurm backend for all four methods: learner (worker) jobs preempted with scontrol requeue "
                "and held on one schedule from each run's submission, released after the requeue wait"
            ),
        )
    finally:
        chaos_slurm.stop_cluster(private)


def preempted_run(
    flags: list[str],
    run_dir: Path,
    what: str,
    requeues: list[tuple[float, int]],
    env: dict,
    console,  # noqa: ANN001
    timeout: float,
    wait: float,
) -> dict:
    """`ddiloco run FLAGS --backend slurm` followed to its end while its learner jobs are requeued on
    `requeues` ((seconds after submission, learner)), each held in the queue for `wait` seconds (the
    scenario's requeue wait); its --json summary, with `requeues` done."""
    from ddiloco.cluster import slurm

    run_dir.parent.mkdir(parents=True, exist_ok=True)
    cmd = [sys.executable, "-m", "ddiloco", "run", *flags, "--backend", "slurm", "--sync-host", "127.0.0.1"]
    cmd += ["--term-grace", "5", "--run-dir", str(run_dir), "--json", "--quiet"]
    if "SLURM_CONF" in env:  # this process asks squeue and scontrol too
        os.environ["SLURM_CONF"] = env["SLURM_CONF"]
    out_path, err_path = run_dir.parent / f"{run_dir.name}.out", run_dir.parent / f"{run_dir.name}.err"
    with open(out_path, "w") as out, open(err_path, "w") as err:  # files, not pipes: nothing blocks
        launcher = subprocess.Popen(cmd, stdout=out, stderr=err, text=True, env=env)
    pending, done, submitted, timed_out = sorted(requeues), 0, None, False
    held: list[tuple[float, str]] = []
    deadline = time.monotonic() + timeout
    try:
        while launcher.poll() is None and time.monotonic() < deadline:
            if submitted is None and slurm.jobs_file(run_dir).is_file():
                submitted = time.time()
            if submitted is not None and pending:
                with contextlib.suppress(OSError, ValueError, slurm.SlurmError):
                    jobs = slurm.read_jobs(run_dir)  # read again: ddp's launcher may submit a job anew
                    elapsed = time.time() - submitted
                    states = slurm.states(jobs)
                    done += chaos_slurm.requeue_due(pending, elapsed, jobs, states, console, held, wait)
            if submitted is not None and held:
                chaos_slurm.release_due(held, time.time() - submitted, console)
            time.sleep(POLL)
        timed_out = launcher.poll() is None
    finally:
        if launcher.poll() is None:  # past the timeout, or Ctrl+C: the launcher stops its run cleanly
            launcher.send_signal(signal.SIGINT)
            try:
                launcher.wait(LAUNCHER_GRACE)
            except subprocess.TimeoutExpired:
                launcher.kill()
                launcher.wait(30)
        _cancel_left(run_dir)
    if launcher.returncode != 0 or timed_out:
        raise SystemExit(
            f"ddiloco run ({what}, slurm) failed or ran past {timeout:.0f} s:\n{err_path.read_text()[-3000:]}"
        )
    summary = json.loads(out_path.read_text().strip().splitlines()[-1])
    summary["requeues"] = done
    return summary


def _cancel_left(run_dir: Path) -> None:
    """Cancel this run's jobs that are still queued or running (the launcher normally left none)."""
    from ddiloco.cluster import slurm

    with contextlib.suppress(OSError, ValueError, slurm.SlurmError):
        jobs = slurm.read_jobs(run_dir)
        states = slurm.states(jobs)
        slurm.cancel({r: j for r, j in jobs.items() if states[r] not in slurm.FINISHED | {"GONE"}})
