"""Chaos on a real Slurm cluster: learner jobs preempted (`scontrol requeue`) at exponential intervals,
Decoupled DiLoCo against the synchronous baseline under the same schedule, and the cost of cold
restarts against peer recovery of the inner state. Run through `benchmarks/chaos.py --backend slurm`.

Four runs, one after the other, each `ddiloco run --backend slurm --detach` on the same schedule of
requeues (offsets from its own submission):

    decoupled        the learners' inner state on the shared run directory (a requeued job finds it)
    decoupled-peer   the inner state on per-start scratch: every requeue comes back with an empty disk
                     and copies a live peer's AdamW state (peer recovery)
    decoupled-cold   the same scratch, peer recovery off: every requeue restarts AdamW from zero
    diloco           the synchronous baseline (one fragment, blocking syncs, K = M), shared state

Reported per run: goodput, uptime (share of learner-time inside a running learner process, from the
journals), goodput / uptime, the longest gap between two merges, eval loss at equal tokens, requeues.
Slurm: the cluster `sinfo` reaches (SLURM_CONF or the system's), else a private one on 127.0.0.1
started from tests/support/slurm_cluster.py (root, Debian's slurmctld/slurmd/munge). `cluster`,
`schedule`, `requeue_due` and `stop_cluster` also serve time_to_loss.py's preemptible scenario.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from rich.console import Console

ROOT = Path(__file__).resolve().parents[1]
CONFIGS = {
    "decoupled": ("decoupled", ["--learner-state", "shared"]),
    "decoupled-peer": ("decoupled", ["--learner-state", "scratch"]),
    "decoupled-cold": ("decoupled", ["--learner-state", "scratch", "--no-peer-recovery"]),
    "diloco": ("diloco", ["--learner-state", "shared"]),
}


def cluster(console) -> tuple[Path | None, dict]:  # noqa: ANN001
    """(private cluster dir to stop at the end or None, environment) for the Slurm commands."""
    if shutil.which("sinfo") and subprocess.run(["sinfo", "-h"], capture_output=True, timeout=20).returncode == 0:
        return None, dict(os.environ)
    sys.path.insert(0, str(ROOT))
    from tests.support import slurm_cluster

    reason = slurm_cluster.missing()
    if reason:
        raise SystemExit(f"no Slurm cluster: {reason}")
    d = Path(tempfile.mkdtemp(prefix="ddiloco-bench-slurm-"))
    slurm_cluster.start(d, nodes=3, cpus=4)
    console.print(f"started a private Slurm cluster in {d}")
    return d, slurm_cluster.env(d)


def schedule(learners: int, mtbf: float, horizon: float, seed: int) -> list[tuple[float, int]]:
    """(seconds after submission, learner) of every requeue, the same for every run."""
    rng = np.random.default_rng([seed, 7919])
    out = []
    for m in range(learners):
        t = float(rng.exponential(mtbf))
        while t < horizon:
            out.append((t, m))
            t += float(rng.exponential(mtbf))
    return sorted(out)


def requeue_due(
    pending: list[tuple[float, int]],
    elapsed: float,
    jobs: dict[str, str],
    states: dict[str, str],
    console: Console,
    held: list[tuple[float, str]] | None = None,
    wait: float = 0.0,
) -> int:
    """Requeue (`scontrol requeue`, what a preemption does) every learner whose time in `pending` has
    come, `elapsed` seconds after its run's submission, taking them off `pending`; returns how many were
    requeued. A learner's job is `learnerM` (ddiloco) or `workerM` (the data-parallel baselines); one
    that is not RUNNING then (already requeued, not back yet) is skipped, as a preemption would find
    nothing to preempt. With `held` (a list this appends to), each job is held in the queue and
    released `wait` seconds later by `release_due`: the requeue wait of a preemption, not Slurm's own."""
    from ddiloco.cluster import slurm

    done = 0
    while pending and pending[0][0] <= elapsed:
        _, m = pending.pop(0)
        role = next((r for r in (f"learner{m}", f"worker{m}") if r in jobs), None)
        if role is None or states.get(role) != "RUNNING":
            continue
        try:
            slurm.requeue(jobs[role], hold=held is not None)
            done += 1
            if held is not None:
                held.append((elapsed + wait, jobs[role]))
        except slurm.SlurmError as exc:  # it left RUNNING meanwhile (requeued, ending)
            console.print(f"  requeue of {role} skipped: {exc}")
    return done


def release_due(held: list[tuple[float, str]], elapsed: float, console: Console) -> None:
    """Release every held job whose wait is over (`requeue_due` with `held`), taking it off `held`."""
    from ddiloco.cluster import slurm

    for entry in [h for h in held if h[0] <= elapsed]:
        held.remove(entry)
        try:
            slurm.release(entry[1])
        except slurm.SlurmError as exc:  # cancelled meanwhile (the run ended)
            console.print(f"  release of job {entry[1]} skipped: {exc}")


def stop_cluster(private: Path | None) -> None:
    """Stop the private cluster `cluster` started (None: a cluster that was there before, left alone)."""
    if private is None:
        return
    sys.path.insert(0, str(ROOT))
    from tests.support import slurm_cluster

    slurm_cluster.stop(private)


def run_one(name: str, args, run_dir: Path, env: dict, requeues: list[tuple[float, int]], console) -> dict:  # noqa: ANN001
    from ddiloco.cluster import slurm
    from ddiloco.launch.evaluate import evaluate_checkpoints
    from ddiloco.launch.summary import summarize
    from ddiloco.learner.journal import read_journals
    from ddiloco.train.tasks import make_task

    method, extra = CONFIGS[name]
    cmd = [
        sys.executable,
        "-m",
        "ddiloco",
        "run",
        "--backend",
        "slurm",
        "--detach",
        "--json",
        "--sync-host",
        "127.0.0.1",
        "--method",
        method,
        "--learners",
        str(args.learners),
        "--model-size",
        args.model_size,
        "--seq-len",
        str(args.seq_len),
        "--batch-size",
        str(args.batch_size),
        "--data",
        str(args.data),
        "--sync-every",
        str(args.sync_every),
        "--fragments",
        str(args.fragments),
        "--grace",
        str(args.grace),
        "--tokens",
        str(args.tokens),
        "--seed",
        str(args.seed),
        "--threads",
        "1",
        "--term-grace",
        "5",
        "--min-step-seconds",
        str(args.min_step_seconds),
        "--run-dir",
        str(run_dir),
        *extra,
    ]
    console.print(f"[bold]{name}[/bold]: {' '.join(cmd[2:])}")
    os.environ.update({k: v for k, v in env.items() if k == "SLURM_CONF"})
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=env)
    if out.returncode != 0:
        raise SystemExit(f"{name}: submission failed:\n{out.stderr[-3000:]}")
    jobs = json.loads(out.stdout.strip().splitlines()[-1])["jobs"]
    submitted, done, pending = time.time(), 0, list(requeues)
    deadline = time.monotonic() + args.timeout
    try:
        while time.monotonic() < deadline:
            states = slurm.states(jobs)
            if states["sync0"] in slurm.FINISHED | {"GONE"}:
                break
            done += requeue_due(pending, time.time() - submitted, jobs, states, console)
            time.sleep(0.5)
        else:
            raise SystemExit(f"{name}: the run did not end within {args.timeout:.0f} s")
    finally:
        slurm.cancel(jobs)
        until = time.monotonic() + 60
        while time.monotonic() < until and set(slurm.states(jobs).values()) - (slurm.FINISHED | {"GONE"}):
            time.sleep(0.5)
    sync_dirs = [run_dir / "sync-0"]
    learner_dirs = [run_dir / f"learner-{m}" for m in range(args.learners)]
    result = summarize(sync_dirs, learner_dirs, args.learners, time.time(), submitted)
    journals = [j for d in learner_dirs for j in read_journals(d, "journal-*.json")]
    lived = sum(
        max(0.0, min(j["updated"], result["window_stop"]) - max(j["started"], result["window_start"])) for j in journals
    )
    result["uptime"] = lived / (args.learners * result["run_seconds"])
    task = make_task("gpt", str(args.data), seq_len=args.seq_len, model_size=args.model_size)
    result.update(evaluate_checkpoints(task, args.seed, sync_dirs, args.eval_batches))
    result["requeues"] = done
    result["goodput_over_uptime"] = result["goodput"] / max(1e-9, result["uptime"])
    return result


def main(args, console) -> dict:  # noqa: ANN001
    private, env = cluster(console)
    try:
        with tempfile.TemporaryDirectory() as tmp_name:
            base = args.run_dir or Path(tmp_name)
            base.mkdir(parents=True, exist_ok=True)
            requeues = schedule(args.learners, args.mtbf, args.timeout, args.seed)
            results = {name: run_one(name, args, base / name, env, requeues, console) for name in CONFIGS}
    finally:
        stop_cluster(private)
    d, s = results["decoupled"], results["diloco"]
    return {
        **results,
        "ratio": d["goodput_over_uptime"],
        "goodput_ratio_vs_sync": d["goodput"] / max(1e-9, s["goodput"]),
        "stall_seconds_max": d["stall_seconds_max"],
        "stall_seconds_max_sync": s["stall_seconds_max"],
        "eval_loss_delta_vs_sync": d["eval_loss"] - s["eval_loss"],
        "eval_loss_cost_of_cold_restarts": results["decoupled-cold"]["eval_loss"]
        - results["decoupled-peer"]["eval_loss"],
    }
