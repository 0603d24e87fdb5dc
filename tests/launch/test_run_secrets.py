"""A real `ddiloco run --token` keeps the token out of every file and log and listens on loopback
only (issue 46): its synchronizer's gRPC port, bulk socket and dashboard, read from /proc while it
trains; then every byte of its run directory and of its console output is searched for the token."""

from __future__ import annotations

import json
import os
import secrets
import stat
import subprocess
import sys
import time

import pytest

from ddiloco.launch.dashauth import view_credential

from ..support.listeners import beyond_loopback, descendants, listeners_of
from .test_run import end_run

LIMIT = 150.0  # seconds the run may take, whatever the machine's load


@pytest.mark.timeout(LIMIT + 30)
def test_a_run_with_a_token_writes_it_nowhere_and_listens_on_loopback_only(tmp_path, shakespeare):
    token = "tok-" + secrets.token_hex(12)
    run_dir = tmp_path / "run"
    cmd = [sys.executable, "-m", "ddiloco", "run", "--model-size", "tiny", "--seq-len", "16", "--data", shakespeare]
    cmd += ["--batch-size", "4", "--learners", "2", "--fragments", "2", "--sync-every", "4", "--heartbeat", "0.2"]
    cmd += ["--tokens", "8000", "--min-step-seconds", "0.02", "--run-dir", str(run_dir), "--json", "--quiet"]
    cmd += ["--token", token]  # on the command line, the way a user leaks it most easily
    out, err = tmp_path / "run.stdout", tmp_path / "run.stderr"
    env = {**os.environ, "COLUMNS": "300"}
    with open(out, "wb") as o, open(err, "wb") as e:
        launcher = subprocess.Popen(cmd, stdout=o, stderr=e, start_new_session=True, env=env)
    seen: set[tuple[str, int]] = set()
    try:
        deadline = time.monotonic() + LIMIT
        while launcher.poll() is None and time.monotonic() < deadline:  # every listener the run ever holds
            seen |= set(listeners_of(descendants({launcher.pid}) - {os.getpid()}))
            time.sleep(0.3)
        launcher.wait(timeout=max(1.0, deadline - time.monotonic()))
    finally:
        if launcher.poll() is None:
            end_run(launcher, run_dir)
    assert launcher.returncode == 0, err.read_text()[-3000:]
    assert json.loads(out.read_text().strip().splitlines()[-1])["tokens_trained"] >= 8000
    # listeners: the synchronizer's gRPC port, its bulk socket and the dashboard at least, all on loopback
    dashboard = (run_dir / "dashboard.url").read_text().strip()
    sync_port = int((run_dir / "sync-0" / "address").read_text().rsplit(":", 1)[1])
    dashboard_port = int(dashboard.split(":")[2].split("/")[0])
    ports = {port for _, port in seen}
    assert {sync_port, dashboard_port} <= ports and len(ports) >= 3, seen
    assert beyond_loopback(sorted(seen)) == [], seen
    # the dashboard's address carries the read-only view credential, in a file of the owner's alone
    assert dashboard.endswith("?view=" + view_credential(token))
    assert stat.S_IMODE((run_dir / "dashboard.url").stat().st_mode) == 0o600
    # the token itself: in no file of the run directory, and not on the console
    files = [p for p in run_dir.rglob("*") if p.is_file()] + [out, err]
    assert len(files) > 10 and any(p.name == "config.json" for p in files)
    holding = [str(p) for p in files if token.encode() in p.read_bytes()]
    assert holding == [], holding
