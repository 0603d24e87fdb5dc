"""A run on a real Slurm cluster (every daemon on 127.0.0.1): `ddiloco run --backend slurm` submits the
synchronizer and two learners as jobs; a learner job is requeued mid-run, as a preemption does, and
comes back as a new process that rejoins; the run reaches its budget and every token is accounted."""

from __future__ import annotations

import contextlib
import json
import math
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from ddiloco.api.control import shard_status
from ddiloco.cluster import slurm as jobs_api
from ddiloco.learner.journal import read_journals

from ..support.runtime import wait_for

TOKEN = "slurm-test-token"
TOKENS_PER_STEP = 4 * 16


def status(address: str) -> dict:
    try:
        return shard_status(address, TOKEN, timeout=2.0)
    except ConnectionError:
        return {}


def journals(run, m: int) -> list[dict]:
    return [j for j in read_journals(run / f"learner-{m}", "journal-*.json") if j]


def launch(run, shakespeare, budget: int, *extra: str, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "ddiloco",
            "run",
            "--backend",
            "slurm",
            "--json",
            "--sync-host",
            "127.0.0.1",
            "--learners",
            "2",
            "--model-size",
            "tiny",
            "--seq-len",
            "16",
            "--data",
            shakespeare,
            "--batch-size",
            "4",
            "--fragments",
            "2",
            "--sync-every",
            "4",
            "--heartbeat",
            "0.2",
            "--threads",
            "1",
            "--min-step-seconds",
            "0.04",
            "--tokens",
            str(budget),
            "--term-grace",
            "5",
            "--run-dir",
            str(run),
            *extra,
        ],
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, "DDILOCO_TOKEN": TOKEN},
    )


@contextlib.contextmanager
def detached(run, shakespeare, budget: int = 10**9, *extra: str, merges: int = 0):  # noqa: ANN001
    """A detached run: (jobs, shard 0's address) once shard 0 answers and has merged `merges` times;
    every job is cancelled on the way out."""
    submit = launch(run, shakespeare, budget, "--detach", *extra)
    assert submit.returncode == 0, submit.stderr[-3000:]
    jobs = json.loads(submit.stdout.strip().splitlines()[-1])["jobs"]
    try:
        address = wait_for(
            lambda: (run / "sync-0" / "address").is_file() and (run / "sync-0" / "address").read_text(),
            120,
            message="the synchronizer job's address",
        )
        wait_for(lambda: status(address).get("merges", 0) >= merges, 120, message="merges")
        yield jobs, address
    finally:
        jobs_api.cancel(jobs)


def shard_pid(run, shard: int) -> int | None:
    """The PID of shard `shard`'s synchronizer process (started by this test's run, through Slurm)."""
    want = f"{run / f'sync-{shard}' / 'synchronizer.toml'}".encode()  # its settings (`--config`)
    for entry in Path("/proc").iterdir():
        try:
            args = (entry / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if b"synchronizer" in args and b"--config" in args and want in args:
            return int(entry.name)
    return None


# slow: 75 s on 2 cores, most of it Slurm's own fixed 10-20 s per requeue and restart, which no budget
# shortens; the default suite keeps scancel's test, CI's slow step runs this one
@pytest.mark.slow
@pytest.mark.timeout(480)
def test_requeued_learner_and_shard_jobs_and_a_killed_shard_all_recover_and_the_run_reaches_its_budget(
    slurm, tmp_path, shakespeare
):
    run = tmp_path / "run"
    # at least 60 s of padded steps: the learners must not reach the budget before Slurm has requeued a
    # learner, restarted shard 0 and moved shard 1 (each a fixed 10-20 s of Slurm's, however fast the
    # steps): with 700 steps each they once did, and no learner was left to follow shard 1
    budget = 2 * 1500 * TOKENS_PER_STEP
    with detached(run, shakespeare, budget, "--sync-shards", "2") as (jobs, address):
        assert set(jobs) == {"sync0", "sync1", "learner0", "learner1"}
        addr = {
            s: wait_for(
                lambda s=s: (run / f"sync-{s}" / "address").is_file() and (run / f"sync-{s}" / "address").read_text(),
                120,
                message=f"shard {s}'s address",
            )
            for s in range(2)
        }  # Slurm may start shard 1's job after shard 0 already answers
        wait_for(
            lambda: all(
                status(address).get("books", {}).get(str(m), {}).get("contributions", 0) >= 2 for m in range(2)
            ),
            120,
            message="both learner jobs to contribute",
        )
        before = status(address)
        jobs_api.requeue(jobs["learner1"])  # what a preemption does: SIGTERM, then the job is queued again
        wait_for(lambda: len(journals(run, 1)) >= 2, 120, message="the requeued learner's new process")
        wait_for(
            lambda: (
                status(address).get("books", {}).get("1", {}).get("contributions", 0)
                >= before["books"]["1"]["contributions"] + 2
            ),
            120,
            message="contributions of the requeued learner",
        )
        # shard 0's process killed with kill -9: its job restarts it from the checkpoint, on the same port
        pid = wait_for(lambda: shard_pid(run, 0), 10, message="shard 0's process")
        killed = status(address)["version_sum"]
        os.kill(pid, signal.SIGKILL)
        wait_for(
            lambda: status(address).get("restored_from") is not None and status(address)["version_sum"] >= killed + 2,
            120,
            message="shard 0 restarted from its checkpoint and merging again",
        )
        assert (run / "sync-0" / "address").read_text() == addr[0]
        # shard 1's job requeued (another node, a new port): learners read its address file again
        jobs_api.requeue(jobs["sync1"])
        moved = wait_for(
            lambda: (lambda a: a if a and a != addr[1] else None)(
                (run / "sync-1" / "address").read_text() if (run / "sync-1" / "address").is_file() else ""
            ),
            120,
            message="shard 1's requeued job to write its new address",
        )
        after = status(moved)
        wait_for(
            lambda: (
                status(moved).get("version_sum", 0) >= after.get("version_sum", 0) + 2
                and all(status(moved).get("books", {}).get(str(m), {}).get("contributions", 0) >= 1 for m in range(2))
            ),
            120,
            message="both learners to follow shard 1 to its new address",
        )
        wait_for(
            lambda: all(jobs_api.states(jobs)[f"sync{s}"] in jobs_api.FINISHED | {"GONE"} for s in range(2)),
            300,
            message="the synchronizer jobs to end at the budget",
        )
    finals = [json.loads((run / f"sync-{s}" / "summary.json").read_text()) for s in range(2)]
    final = finals[0]
    assert all(f["finished"] and f["double_merged_steps"] == 0 for f in finals)
    assert final["tokens_reported"] >= budget and final["version_sum"] > before["version_sum"]
    first, second = sorted(journals(run, 1), key=lambda j: j["started"])[:2]
    assert first["incarnation"] != second["incarnation"] and second["start_position"] <= first["position"]
    assert first["state"] == "done"  # SIGTERM: it sent what it held and left, within --term-grace
    log = "".join(p.read_text() for p in (run / "learner-1").glob("slurm-*.out"))
    assert "start 0 on" in log and "start 1 on" in log  # the same job, restarted by Slurm
    sync_log = "".join(p.read_text() for s in range(2) for p in (run / f"sync-{s}").glob("slurm-*.out"))
    assert "restart 1 from its checkpoint" in sync_log and "synchronizer job" in sync_log
    trained = 0
    for m in range(2):
        learner_log = "".join(p.read_text() for p in (run / f"learner-{m}").glob("slurm-*.out"))
        assert "moved from" in learner_log and "older than our" not in learner_log  # followed; never dragged back
        for j in journals(run, m):
            assert j["tokens"] == (j["position"] - j["start_position"]) * TOKENS_PER_STEP
            trained += j["tokens"]
        assert final["books"][str(m)]["tokens_merged"] <= sum(j["tokens"] for j in journals(run, m))
    assert 0 < final["tokens_merged"] <= trained and final["tokens_reported"] <= trained


@pytest.mark.slow  # the default suite keeps the scancel test
@pytest.mark.timeout(300)
def test_the_launcher_follows_the_run_to_its_end_and_prints_the_summary(slurm, tmp_path, shakespeare):
    budget = 2 * 120 * TOKENS_PER_STEP
    done = launch(tmp_path / "run", shakespeare, budget, timeout=280)
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result["summary"]["finished"] and result["summary"]["tokens_reported"] >= budget
    assert set(jobs_api.states(result["jobs"]).values()) <= jobs_api.FINISHED | {"GONE"}  # nothing left queued


@pytest.mark.slow
@pytest.mark.timeout(360)
def test_a_followed_run_records_what_a_local_run_records(slurm, tmp_path, shakespeare):
    """metrics.jsonl with eval records over time, config.json, summary.json and the --json keys of a
    local run (goodput, eval loss of the final checkpoint): time_to_loss and `ddiloco report` read it."""
    run = tmp_path / "run"
    budget = 2 * 500 * TOKENS_PER_STEP
    done = launch(run, shakespeare, budget, "--method", "decoupled", "--eval-every", "2", timeout=330)
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result["summary"]["finished"] and result["backend"] == "slurm"
    assert 0 < result["goodput"] <= 1 and math.isfinite(result["eval_loss"])
    assert result["tokens_trained"] >= budget and 0 < result["tokens_merged"] <= result["tokens_trained"] * (1 + 1e-9)
    assert 0 < result["availability"] <= 1 and result["window_start"] < result["window_stop"]
    assert json.loads((run / "summary.json").read_text())["goodput"] == result["goodput"]
    config = json.loads((run / "config.json").read_text())
    assert config["settings"]["token"] == "<redacted>" and config["clock_origin"] <= result["window_start"]
    lines = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    evals = [e for e in lines if e["kind"] == "eval"]
    assert len(evals) >= 4, lines  # every 2 s while it ran, and the final one
    times = [e["t"] for e in evals]
    assert times == sorted(times) and len(set(times)) == len(times) and times[0] > 0
    assert all(math.isfinite(e["eval_loss"]) for e in evals)
    assert {e["eval_batches"] for e in evals} == {result["eval_batches"]} == {20}  # one yardstick: --eval-batches
    assert evals[-1]["eval_loss"] == result["eval_loss"]  # the final evaluation comes last
    assert {"progress", "train"} <= {e["kind"] for e in lines}
    report = subprocess.run(
        [sys.executable, "-m", "ddiloco", "report", str(run)], capture_output=True, text=True, timeout=120
    )
    assert report.returncode == 0, report.stderr[-2000:]
    assert (run / "report" / "report.html").is_file()


@pytest.mark.slow  # the default suite keeps the scancel test
@pytest.mark.timeout(300)
def test_slurm_stop_ends_a_detached_run_cleanly(slurm, tmp_path, shakespeare):
    run = tmp_path / "run"
    with detached(run, shakespeare, merges=4) as (jobs, _):
        stopped = subprocess.run(
            [sys.executable, "-m", "ddiloco", "slurm-stop", str(run)], capture_output=True, text=True, timeout=150
        )
        assert stopped.returncode == 0, stopped.stderr[-2000:]
        assert set(jobs_api.states(jobs).values()) <= jobs_api.FINISHED | {"GONE"}
    final = json.loads((run / "sync-0" / "summary.json").read_text())
    assert final["stopping"] and final["merges"] >= 4  # stopped by request, checkpoint and summary written
    for m in range(2):
        assert all(j["state"] == "done" for j in journals(run, m))  # each learner sent its work and left


@pytest.mark.slow  # the default suite keeps the scancel test
@pytest.mark.timeout(300)
def test_a_learner_of_two_nodes_runs_torchrun_on_each_and_trains(slurm, tmp_path, shakespeare):
    run = tmp_path / "run"
    done = launch(
        run, shakespeare, 2 * 150 * TOKENS_PER_STEP, "--learners", "1", "--nodes-per-learner", "2", timeout=280
    )
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result["summary"]["finished"] and result["summary"]["books"]["0"]["contributions"] > 0
    log = "".join(p.read_text() for p in (run / "learner-0").glob("slurm-*.out"))
    nodes = {line.rsplit("(Slurm node ", 1)[1].rstrip(")") for line in log.splitlines() if "(Slurm node " in line}
    assert "rank 0/2" in log and "rank 1/2" in log and len(nodes) == 2  # one torchrun per node, c10d rendezvous


@pytest.mark.timeout(300)
def test_scancel_of_the_whole_run_ends_every_process_cleanly(slurm, tmp_path, shakespeare):
    run = tmp_path / "run"
    with detached(run, shakespeare, merges=4) as (jobs, _):
        jobs_api.cancel(jobs)  # scancel: SIGTERM to every job, SIGKILL after KillWait
        wait_for(
            lambda: set(jobs_api.states(jobs).values()) <= jobs_api.FINISHED | {"GONE"}, 60, message="every job to end"
        )
    final = json.loads((run / "sync-0" / "summary.json").read_text())
    assert final["merges"] >= 4 and (run / "sync-0" / "manifest.json").is_file()  # checkpoint on SIGTERM
    for m in range(2):
        assert all(j["state"] == "done" for j in journals(run, m))  # each learner left within its grace
