"""Helpers of the real-process tests: a data-parallel run started as `python -m ddiloco.dataparallel
run`, waits bounded in count and time, and every process ended by its PID."""

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

BATCH, SEQ = 4, 32
TOKENS_PER_WORKER_STEP = BATCH * SEQ
LIMIT = 150.0  # seconds any run of these tests may take, whatever the machine's load


def command(run_dir: Path, data: str, method: str, tokens: int, *extra: str) -> list[str]:
    return [
        sys.executable,
        "-m",
        "ddiloco.dataparallel",
        "run",
        "--run-dir",
        str(run_dir),
        "--method",
        method,
        "--learners",
        "2",
        "--model-size",
        "tiny",
        "--data",
        data,
        "--tokens",
        str(tokens),
        "--batch-size",
        str(BATCH),
        "--seq-len",
        str(SEQ),
        "--checkpoint-every",
        "10",
        "--eval-every",
        "0",
        "--eval-batches",
        "8",
        "--min-step-seconds",
        "0.05",
        "--learner-down",
        "1",
        "--collective-timeout",
        "20",
        "--time-limit",
        str(LIMIT - 20),
        "--json",
        *extra,
    ]


def start(run_dir: Path, data: str, method: str, tokens: int, *extra: str) -> subprocess.Popen:
    run_dir.parent.mkdir(parents=True, exist_ok=True)
    return subprocess.Popen(
        command(run_dir, data, method, tokens, *extra),
        stdout=subprocess.PIPE,
        stderr=open(run_dir.parent / f"{run_dir.name}.launcher.log", "wb"),
        text=True,
        start_new_session=True,
    )


@contextlib.contextmanager
def running(run_dir: Path, data: str, method: str, tokens: int, *extra: str) -> Iterator[subprocess.Popen]:
    """A run's launcher, ended (with every worker it started) when the block is left, however."""
    launcher = start(run_dir, data, method, tokens, *extra)
    try:
        yield launcher
    finally:
        end(launcher, run_dir)


def started_pids(run_dir: Path) -> list[dict]:
    path = run_dir / "events.jsonl"
    if not path.is_file():
        return []
    return [e for e in map(json.loads, path.read_text().splitlines()) if e.get("kind") == "learner_started"]


def terminate(launcher: subprocess.Popen, grace: float) -> None:
    """SIGTERM (the launcher ends what it started), then SIGKILL after `grace` seconds."""
    if launcher.poll() is None:
        launcher.send_signal(signal.SIGTERM)
        try:
            launcher.wait(timeout=grace)
        except subprocess.TimeoutExpired:
            launcher.kill()
            launcher.wait(timeout=10)


def end(launcher: subprocess.Popen, run_dir: Path) -> None:
    """The launcher ends its workers on SIGTERM; whatever is still running after that is killed by PID."""
    terminate(launcher, grace=30)
    for e in started_pids(run_dir):
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(e["pid"], signal.SIGKILL)


def finish(launcher: subprocess.Popen, run_dir: Path) -> dict:
    """The run's summary line, once the launcher exits (bounded)."""
    try:
        out, _ = launcher.communicate(timeout=LIMIT)
    finally:
        end(launcher, run_dir)
    assert launcher.returncode == 0, (
        launcher.returncode,
        (run_dir.parent / f"{run_dir.name}.launcher.log").read_text()[-2000:],
    )
    return json.loads(out.strip().splitlines()[-1])


def wait_for_checkpoint(run_dir: Path, step: int, launcher: subprocess.Popen) -> int:
    """Poll (bounded) until the job's checkpoint holds at least `step` steps; returns its step."""
    manifest = run_dir / "checkpoint" / "checkpoint.json"
    deadline = time.monotonic() + LIMIT
    while time.monotonic() < deadline and launcher.poll() is None:
        with contextlib.suppress(OSError, ValueError, KeyError):
            found = int(json.loads(manifest.read_text())["lineage"]["step"])
            if found >= step:
                return found
        time.sleep(0.05)
    raise AssertionError(f"no checkpoint of step {step} in {run_dir} (launcher exit {launcher.poll()})")


def kill_worker(run_dir: Path, slot: int) -> int:
    """kill -9 of worker `slot`'s newest process; its PID."""
    pid = [e["pid"] for e in started_pids(run_dir) if e["learner"] == slot][-1]
    os.kill(pid, signal.SIGKILL)
    return pid


def journals(run_dir: Path, slot: int) -> list[dict]:
    """Worker `slot`'s journals, one per process it ran in, oldest first."""
    paths = sorted((run_dir / f"learner-{slot}").glob("journal-*.json"), key=lambda p: int(p.stem.split("-")[2]))
    return [json.loads(p.read_bytes().strip()) for p in paths]


def generations(run_dir: Path) -> list[dict]:
    lines = (run_dir / "dataparallel.jsonl").read_text().splitlines()
    return sorted((e for e in map(json.loads, lines) if e["kind"] == "formed"), key=lambda e: e["generation"])
