"""`ddiloco run --network hosts` as a user runs it (a real process): each process on its own host, the
links measured and recorded, the run merged, and nothing left behind, also after Ctrl-C."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from ddiloco.hosts import unavailable_reason
from ddiloco.hosts.commands import netns_names
from ddiloco.records.atomic import read_json
from ddiloco.records.events import read_events

from ..support.runtime import wait_for
from .peering import alive

LINKS = ["latency=15ms,rate=100mbit,loss=0.1%", "learner1=latency=30ms,jitter=2ms,rate=20mbit"]


def _command(run_dir: Path, data: str, tokens: int, *extra: str) -> list[str]:
    args = ["--model", "gpt", "--model-size", "tiny", "--seq-len", "16", "--batch-size", "4", "--data", data]
    links = [a for spec in LINKS for a in ("--link", spec)]
    return [
        *(sys.executable, "-m", "ddiloco", "run", "--network", "hosts", *links, "--learners", "2"),
        *args,
        *("--tokens", str(tokens), "--sync-every", "4", "--quiet", "--no-dashboard", "--eval-every", "0"),
        *("--run-dir", str(run_dir), *extra),
    ]


def _pids(run_dir: Path) -> list[int]:
    """Every synchronizer and learner process the launcher started (its own event log)."""
    kinds = ("synchronizer_started", "learner_started")
    return [e["pid"] for e in read_events(run_dir / "events.jsonl") if e["kind"] in kinds]


def _left_behind(run_dir: Path, prefix: str) -> tuple[list[str], list[int]]:
    return [n for n in netns_names() if n.startswith(prefix)], [p for p in _pids(run_dir) if alive(p)]


@pytest.fixture()
def root() -> None:
    reason = unavailable_reason()
    if reason is not None:
        pytest.skip(reason)


@pytest.mark.timeout(300)
def test_run_on_hosts_measures_and_records_each_link(root, tmp_path: Path, shakespeare: str):
    run_dir = tmp_path / "run"
    done = subprocess.run(
        [*_command(run_dir, shakespeare, 4000), "--json"], capture_output=True, text=True, timeout=280
    )
    assert done.returncode == 0, done.stderr[-3000:]
    summary = json.loads(done.stdout.strip().splitlines()[-1])
    hosts = summary["network"]["hosts"]
    assert json.loads((run_dir / "network.json").read_text())["hosts"] == hosts
    assert set(hosts) == {"launcher", "sync0", "learner0", "learner1"}
    # each shard listened on its host's own address, and the learners reached it there
    assert (run_dir / "sync-0" / "address").read_text().startswith(hosts["sync0"]["address"] + ":")
    assert hosts["learner1"]["link"] == "rate=20mbit,latency=30ms,jitter=2ms"
    # measured: the round trip is at least the links' latency (sync0 is unshaped), the rate at most the tbf's
    assert hosts["learner0"]["rtt_ms_min"] >= 15 and hosts["learner1"]["rtt_ms_min"] >= 30
    assert 0 < hosts["learner1"]["up_mbit_s"] <= 20 * 1.05 and 0 < hosts["learner1"]["down_mbit_s"] <= 20 * 1.05
    for m in (0, 1):  # both learners' work crossed their links and was merged
        assert hosts[f"learner{m}"]["sent_bytes"] > 0
        assert read_json(run_dir / "sync-0" / "summary.json")["books"][str(m)]["tokens_merged"] > 0
    assert summary["double_merged_steps"] == 0
    assert hosts["launcher"]["sent_bytes"] > 0  # the launcher asked the shard for its status across the network
    assert "rtt" in done.stderr and "carried" in done.stderr  # printed as well as recorded
    assert _left_behind(run_dir, summary["network"]["prefix"]) == ([], [])


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_ctrl_c_removes_every_host_and_process(root, tmp_path: Path, shakespeare: str):
    run_dir = tmp_path / "run"
    err = open(tmp_path / "stderr.log", "wb")  # noqa: SIM115 (closed below)
    proc = subprocess.Popen(
        _command(run_dir, shakespeare, 10_000_000, "--min-step-seconds", "0.05"), stdout=err, stderr=err
    )
    try:
        wait_for(lambda: _merged(run_dir), 200, message="a first merge")
        prefixes = {n.rsplit("-", 1)[0] for n in netns_names() if n.startswith("ddl-")}
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=120) is not None
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        err.close()
    pids = _pids(run_dir)
    assert pids and not [p for p in pids if alive(p)]
    prefix = json.loads((run_dir / "network.json").read_text())["prefix"]
    assert prefix in prefixes  # the hosts existed during the run ...
    assert not [n for n in netns_names() if n.startswith(prefix)]  # ... and are gone


def _merged(run_dir: Path) -> bool:
    events = run_dir / "sync-0" / "events.jsonl"
    return events.is_file() and any(e["kind"] == "merge" for e in read_events(events))
