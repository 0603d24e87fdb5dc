"""`ddiloco run --method ddp --network hosts` as a user runs it (a real process): each data-parallel
worker in a namespace host of its own, gloo's all-reduce and the store across kernel-shaped links, every
worker ending with the same parameters, and nothing left behind."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from ddiloco.dataparallel.checkpoint import MODEL, read_manifest
from ddiloco.dataparallel.worker import params_digest
from ddiloco.hosts import unavailable_reason
from ddiloco.hosts.commands import netns_names
from ddiloco.records.events import read_events
from ddiloco.train.tasks import make_task

from .peering import alive

WORKERS, STEPS, BATCH, SEQ = 2, 40, 4, 16
LINK = "rate=50mbit,latency=2ms"
LIMIT = 240.0  # seconds the run may take


@pytest.fixture()
def root() -> None:
    reason = unavailable_reason()
    if reason is not None:
        pytest.skip(reason)


def _command(run_dir: Path, data: str) -> list[str]:
    return [
        *(sys.executable, "-m", "ddiloco", "run", "--method", "ddp", "--network", "hosts", "--link", LINK),
        *("--learners", str(WORKERS), "--model-size", "tiny", "--seq-len", str(SEQ), "--batch-size", str(BATCH)),
        *("--data", data, "--tokens", str(WORKERS * BATCH * SEQ * STEPS), "--quiet", "--no-dashboard"),
        *("--eval-every", "0", "--run-dir", str(run_dir), "--json"),
    ]


def _worker_pids(run_dir: Path) -> dict[int, int]:
    path = run_dir / "events.jsonl"
    events = read_events(path) if path.is_file() else []
    return {e["learner"]: e["pid"] for e in events if e["kind"] == "learner_started"}


def _namespace(pid: int) -> str | None:
    """The name of the namespace (`ip netns`) process `pid` runs in; None while it runs in none named
    (or is gone)."""
    try:
        inode = os.stat(f"/proc/{pid}/ns/net").st_ino
    except OSError:
        return None
    for name in netns_names():
        with contextlib.suppress(OSError):
            if os.stat(f"/run/netns/{name}").st_ino == inode:
                return name
    return None


def _journals(run_dir: Path, slot: int) -> list[dict]:
    return [json.loads(p.read_text()) for p in sorted((run_dir / f"learner-{slot}").glob("journal-*.json"))]


@pytest.mark.timeout(300)
def test_ddp_workers_all_reduce_across_shaped_links(root, tmp_path: Path, shakespeare: str):
    run_dir = tmp_path / "run"
    run = subprocess.Popen(_command(run_dir, shakespeare), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    seen: dict[int, str] = {}  # worker slot -> its network namespace's name, read while it ran
    pids: dict[int, int] = {}
    try:
        deadline = time.monotonic() + LIMIT
        while run.poll() is None and len(seen) < WORKERS and time.monotonic() < deadline:
            pids = _worker_pids(run_dir)
            for slot, pid in pids.items():
                name = _namespace(pid)
                if name is not None and slot not in seen:
                    seen[slot] = name
            time.sleep(0.05)
        out, err = run.communicate(timeout=max(1.0, deadline - time.monotonic()))
    finally:
        if run.poll() is None:  # SIGTERM: the run ends its workers and removes its hosts
            run.send_signal(signal.SIGTERM)
            with contextlib.suppress(subprocess.TimeoutExpired):
                run.wait(timeout=60)
        if run.poll() is None:
            run.kill()
            run.wait(timeout=10)
    assert run.returncode == 0, err[-3000:]
    summary = json.loads(out.strip().splitlines()[-1])
    network = summary["network"]
    assert summary["finished"] and summary["inner_steps"] == STEPS and summary["error"] is None
    assert set(network["hosts"]) == {"launcher", *(f"learner{m}" for m in range(WORKERS))}

    # each worker ran in a namespace of the run's own, a different one each
    assert len(seen) == WORKERS and len(set(seen.values())) == WORKERS, seen
    assert all(name.startswith(network["prefix"] + "-") for name in seen.values()), (seen, network["prefix"])

    # every worker ends with the same parameters: those of the final checkpoint
    digests = {j["final_params_sha256"] for m in range(WORKERS) for j in _journals(run_dir, m)}
    manifest = read_manifest(run_dir / "checkpoint")
    assert manifest is not None and manifest["final"]
    saved = load_file(str(run_dir / "checkpoint" / manifest["folder"] / MODEL))
    model = make_task("gpt", shakespeare, seq_len=SEQ, model_size="tiny").build_model(0)
    with torch.no_grad():
        for name, p in model.named_parameters():
            p.copy_(saved[name])
    assert digests == {params_digest(model)}

    # the all-reduce's bytes crossed the shaped links: during the run (after the links were measured), each
    # host's link carried at least what its worker booked, each way
    for m in range(WORKERS):
        booked = sum(j["allreduce_bytes_sent"] for j in _journals(run_dir, m))
        carried = network["hosts"][f"learner{m}"]
        assert booked > 0 and carried["run_sent_bytes"] >= booked and carried["run_received_bytes"] >= booked
        assert carried["link"] == "rate=50mbit,latency=2ms"

    # nothing left behind: no namespace of the run, no worker
    assert not [n for n in netns_names() if n.startswith(network["prefix"])]
    assert not [p for p in pids.values() if alive(p)]
