"""The data-parallel baselines on a real Slurm cluster (every daemon on 127.0.0.1): `ddiloco run --method
ddp|elastic-ddp --backend slurm` runs each worker as a requeueable job; one worker's job is requeued
mid-run, as a preemption does. `ddp` restarts the whole job from its checkpoint; `elastic-ddp` goes on
with the survivor and takes the worker back when Slurm starts it again. Every token is accounted."""

from __future__ import annotations

import contextlib
import json
import subprocess
import sys
from pathlib import Path

import pytest

from ddiloco.cluster import slurm as jobs_api

from ..dataparallel.runs import terminate
from ..support.runtime import wait_for

BATCH, SEQ = 4, 32
STEP_TOKENS = 2 * BATCH * SEQ  # both workers, one step
BUDGET = 240 * STEP_TOKENS
LIMIT = 400.0


def formed(run: Path) -> list[dict]:
    path = run / "dataparallel.jsonl"
    lines = path.read_text().splitlines() if path.is_file() else []
    return sorted((e for e in map(json.loads, lines) if e.get("kind") == "formed"), key=lambda e: e["generation"])


def checkpoint_step(run: Path) -> int:
    with contextlib.suppress(OSError, ValueError, KeyError):
        return int(json.loads((run / "checkpoint" / "checkpoint.json").read_text())["lineage"]["step"])
    return -1


def journals(run: Path, slot: int) -> list[dict]:
    paths = sorted((run / f"learner-{slot}").glob("journal-*.json"), key=lambda p: int(p.stem.split("-")[2]))
    return [json.loads(p.read_bytes().strip()) for p in paths]


def launch(run: Path, method: str, shakespeare: str) -> subprocess.Popen:
    args = [
        *("--method", method, "--backend", "slurm", "--sync-host", "127.0.0.1", "--learners", "2"),
        *("--model-size", "tiny", "--data", shakespeare, "--seq-len", str(SEQ), "--batch-size", str(BATCH)),
        *("--sync-every", "10", "--tokens", str(BUDGET), "--min-step-seconds", "0.2", "--threads", "1"),
        *("--eval-every", "0", "--eval-batches", "4", "--run-dir", str(run), "--json"),
    ]
    return subprocess.Popen(
        [sys.executable, "-m", "ddiloco", "run", *args],
        stdout=subprocess.PIPE,
        stderr=open(run.parent / f"{run.name}.launcher.log", "wb"),
        text=True,
        start_new_session=True,
    )


def end(launcher: subprocess.Popen, run: Path) -> None:
    """The launcher cancels its jobs on SIGTERM; whatever is left is cancelled by job ID."""
    terminate(launcher, grace=60)
    with contextlib.suppress(FileNotFoundError, ValueError, jobs_api.SlurmError):
        jobs_api.cancel(jobs_api.read_jobs(run))


@pytest.mark.slow
@pytest.mark.timeout(int(LIMIT) + 120)
@pytest.mark.parametrize("method", ["ddp", "elastic-ddp"])
def test_a_requeued_worker_job_restarts_ddp_from_its_checkpoint_and_elastic_ddp_goes_on_and_takes_it_back(
    slurm, tmp_path: Path, shakespeare: str, method: str
):
    run = tmp_path / "run"
    launcher = launch(run, method, shakespeare)
    try:
        wait_for(lambda: checkpoint_step(run) >= 20 or launcher.poll() is not None, 240, message="a checkpoint")
        assert launcher.poll() is None, (run.parent / "run.launcher.log").read_text()[-3000:]
        jobs_api.requeue(jobs_api.read_jobs(run)["worker1"])  # what a preemption does
        requeued_at = checkpoint_step(run)
        if method == "elastic-ddp":
            wait_for(lambda: any(g["members"] == [0] for g in formed(run)), 120, message="the survivor alone")
        out, _ = launcher.communicate(timeout=LIMIT)
    finally:
        end(launcher, run)
    assert launcher.returncode == 0, (run.parent / "run.launcher.log").read_text()[-3000:]
    result = json.loads(out.strip().splitlines()[-1])
    assert result["error"] is None and result["finished"] and result["backend"] == "slurm"
    assert result["tokens_merged"] >= BUDGET
    assert result["tokens_trained"] == result["tokens_merged"] + result["tokens_lost"] >= result["tokens_merged"]
    assert result["tokens_by_cause"]["unsent"] == result["tokens_lost"]
    assert result["learner_restarts"] >= 1
    gens = formed(run)
    assert gens[0]["members"] == [0, 1] and gens[0]["step"] == 0
    log = "".join(p.read_text() for p in (run / "learner-1").glob("slurm-*.out"))
    assert "start 0 on" in log and "start 1 on" in log  # the same job, started again by Slurm
    trained = sum(j["tokens"] for m in (0, 1) for j in journals(run, m))
    assert trained == result["tokens_trained"]
    if method == "ddp":
        # the whole job restarted: every worker ran in two processes, the second from the checkpoint
        assert result["job_restarts"] >= 1
        notes = (run / "dataparallel.jsonl").read_text()
        assert '"job_restart"' in notes
        resumed = [g for g in gens[1:] if g["members"] == [0, 1]]
        assert resumed and 10 <= resumed[0]["step"] <= requeued_at + 10 and resumed[0]["step"] % 10 == 0
        for m in (0, 1):
            runs = journals(run, m)
            assert len(runs) >= 2 and runs[0]["start_step"] == 0 and runs[1]["start_step"] == resumed[0]["step"]
        assert result["tokens_lost"] > 0  # the steps after the checkpoint were trained again
    else:
        assert result["job_restarts"] == 0
        assert result["stall_seconds_max"] < 20  # the survivor never waited out a generation naming the dead peer
        alone = next(i for i, g in enumerate(gens) if g["members"] == [0])
        assert any(g["members"] == [0, 1] for g in gens[alone + 1 :]), gens  # taken back
        assert len(journals(run, 0)) == 1  # the survivor is the same process throughout
        assert len(journals(run, 1)) == 2
