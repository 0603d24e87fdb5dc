"""Command lines and probes for tests that run the real `ddiloco synchronizer` / `ddiloco learner`."""

from __future__ import annotations

import contextlib
import json
import time
from pathlib import Path

from ddiloco.launch.procs import ddiloco_command
from ddiloco.learner.journal import read_journals

from .runtime import RawClient, wait_for

TOKENS_PER_STEP = 4 * 16


def model_args(data: str, learners: int) -> list[str]:
    return ["--model", "gpt", "--model-size", "tiny", "--seq-len", "16", "--data", data, "--learners", str(learners)]


def start_synchronizer(procs, tmp: Path, data: str, learners: int, port: int = 0, *extra: str):
    d = tmp / "sync"
    d.mkdir(exist_ok=True)
    (d / "address").unlink(missing_ok=True)
    cmd = ddiloco_command(
        "synchronizer",
        "--port",
        str(port),
        "--address-file",
        str(d / "address"),
        *model_args(data, learners),
        "--fragments",
        "2",
        "--sync-every",
        "4",
        "--overlap",
        "2",
        "--heartbeat",
        "0.2",
        "--checkpoint-dir",
        str(d),
        "--event-log",
        str(d / "events.jsonl"),
        "--summary",
        str(d / "summary.json"),
        "--max-learners",
        str(learners),
        *extra,
    )
    child = procs.start("sync", cmd, d / "stderr.log", d / "stdout.log")
    address = wait_for(
        lambda: (d / "address").is_file() and (d / "address").read_text(), 60, message="the synchronizer's address"
    )
    return child, address


def start_learner(procs, tmp: Path, data: str, learners: int, address: str, m: int, *extra: str):
    d = tmp / f"learner-{m}"
    d.mkdir(exist_ok=True)
    cmd = ddiloco_command(
        "learner",
        "--connect",
        address,
        "--id",
        str(m),
        *model_args(data, learners),
        "--batch-size",
        "4",
        "--threads",
        "1",
        "--state-dir",
        str(d),
        *extra,
    )
    return procs.start(f"learner-{m}", cmd, d / "stderr.log", d / "stdout.log")


def status(address: str) -> dict:
    client = RawClient(address)
    try:
        return client.call("Status", {}, timeout=2.0)
    except Exception:
        return {}
    finally:
        client.close()


def stop_run(address: str) -> None:
    client = RawClient(address)
    try:
        client.call("Stop", {"reason": "test is done"})
    finally:
        client.close()


def journals(tmp: Path, m: int) -> list[dict]:
    return [j for j in read_journals(tmp / f"learner-{m}", "journal-*.json") if j]


def events(tmp: Path) -> list[dict]:
    lines = (tmp / "sync" / "events.jsonl").read_text().splitlines()
    out = []
    for line in lines:
        with contextlib.suppress(json.JSONDecodeError):
            out.append(json.loads(line))
    return out


def wait_exit(children, timeout: float = 60.0) -> list[int]:
    deadline = time.monotonic() + timeout
    for c in children:
        while c.alive() and time.monotonic() < deadline:
            time.sleep(0.05)
    return [c.poll() for c in children]
