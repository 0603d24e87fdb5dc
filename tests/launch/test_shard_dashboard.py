"""The dashboard of a hand-started `ddiloco synchronizer --dashboard` (issue 13, item 3): real processes,
real HTTP on loopback, the same page as `ddiloco run`'s, fed by the shard's own status."""

from __future__ import annotations

import json
import re
import time

import pytest

from ddiloco.launch.shardstate import ShardState

from ..support.processes import start_learner, start_synchronizer, stop_run, wait_exit
from ..support.runtime import wait_for
from .test_dashboard import CHROMIUM, dump_dom, get, shown


def test_learner_rows_follow_the_sessions():
    status = {
        "started_wall": time.time() - 10,
        "first_join_wall": time.time() - 8,
        "useful_seconds": 8.0,
        "version_sum": 5,
        "merges": 5,
        "tokens_reported": 640,
        "live": [0, 1],
        "learners": {"0": {"step": 7, "loss": 2.5}, "1": {"step": 0}},
        "books": {"0": {"tokens_trained": 448}, "2": {"tokens_trained": 64, "tokens_merged": 64.0}},
    }
    state = ShardState(lambda: status, "decoupled", learners=2)()
    rows = {r["id"]: r for r in state["learners"]}
    assert (rows[0]["state"], rows[1]["state"], rows[2]["state"]) == ("running", "joining", "gone")
    assert rows[0]["tokens_trained"] == 448 and rows[2]["tokens_merged"] == 64.0
    assert state["goodput"] == pytest.approx(8.0 / (2 * 8.0), rel=0.05)
    assert state["history"] == [{"kind": "train", "t": pytest.approx(10, abs=1), "tokens": 640, "train_loss": 2.5}]


def dashboard_url(stdout_path) -> str | None:  # noqa: ANN001
    match = re.search(r"dashboard: (http://\S+)", stdout_path.read_text() if stdout_path.is_file() else "")
    return match.group(1) if match else None


@pytest.mark.timeout(200)
def test_hand_started_synchronizer_serves_its_dashboard(tmp_path, shakespeare, procs):
    sync, address = start_synchronizer(procs, tmp_path, shakespeare, 2, 0, "--dashboard", "--duration", "120")
    url = wait_for(lambda: dashboard_url(tmp_path / "sync" / "stdout.log"), 30, 0.1, "the dashboard's address")
    assert url.startswith("http://127.0.0.1:")
    learners = [
        start_learner(procs, tmp_path, shakespeare, 2, address, m, "--min-step-seconds", "0.05") for m in range(2)
    ]

    def state() -> dict:
        code, body = get(url + "state.json")
        return json.loads(body) if code == 200 else {}

    first = wait_for(
        lambda: (s := state()) and [r["state"] for r in s["learners"]].count("running") == 2 and s,
        90,
        0.5,
        "both learners running on the dashboard",
    )
    # Merges and trained tokens reach the shard on their own paths (pushes, heartbeats): wait for both.
    later = wait_for(
        lambda: (s := state()) and s["version"] > first["version"] and s["tokens"] > first["tokens"] and s,
        60,
        0.5,
        "the version and the trained tokens to advance",
    )
    assert later["merges"] > first["merges"] and later["tokens"] > first["tokens"]
    wait_for(lambda: state().get("history"), 30, 0.5, "a training-loss point for the curve")
    if CHROMIUM is not None:  # the page itself, in a real browser
        dom = dump_dom(url, 2500)
        assert shown(dom, "learner-count") in ("1", "2") and shown(dom, "version").isdigit()
    stop_run(address)
    assert wait_exit([sync, *learners], 90) == [0, 0, 0]
