"""A local data-parallel run listens on loopback only (issue 46): the launcher's rendezvous store
and gloo's sockets in every worker, read from /proc while the job trains."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from ..support.listeners import beyond_loopback, descendants, listeners_of, other_interface
from .runs import LIMIT, TOKENS_PER_WORKER_STEP, generations, running


def formed(run_dir: Path) -> bool:
    return (run_dir / "dataparallel.jsonl").is_file() and bool(generations(run_dir))


TOKENS = 2 * TOKENS_PER_WORKER_STEP * 400  # long enough to be looked at while it trains


@pytest.mark.timeout(LIMIT + 30)
def test_a_local_run_listens_on_loopback_only(shakespeare: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    interface = other_interface()
    if interface is not None:  # as on a host whose name resolves to a LAN address: gloo would bind there
        monkeypatch.setenv("GLOO_SOCKET_IFNAME", interface)
    run_dir = tmp_path / "run"
    with running(run_dir, shakespeare, "elastic-ddp", TOKENS) as launcher:
        deadline = time.monotonic() + LIMIT
        while not formed(run_dir) and launcher.poll() is None and time.monotonic() < deadline:
            time.sleep(0.1)
        assert formed(run_dir), "the job never formed"
        found = listeners_of(descendants({launcher.pid}))
        workers = descendants({launcher.pid}) - {launcher.pid, os.getpid()}
        gloo = listeners_of(workers)
    assert found and beyond_loopback(found) == [], found
    assert gloo, "the workers' gloo sockets were not seen"  # the check looked where gloo listens
