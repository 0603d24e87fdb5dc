"""Real ddiloco runs across hosts: the synchronizer listens on host a's own address (beyond loopback,
so the token rule applies), a learner on host b trains against it through shaped, delayed links and
its work is merged; cut off for a while, it is declared gone, comes back after the heal, and the run
ends with every merged step counted once."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from ddiloco.records.atomic import read_json
from ddiloco.records.events import read_events

from ..support.processes import TOKENS_PER_STEP, journals, model_args
from ..support.runtime import wait_for

LINK = "rate=100mbit,latency=5ms"  # the delay goes through the relay where the kernel has no netem


def _ddiloco(*args: str) -> list[str]:
    return [sys.executable, "-m", "ddiloco", *args]


def start_run(
    net, tmp: Path, data: str, steps: int, *learner_args: str
) -> tuple[subprocess.Popen, subprocess.Popen, Path]:
    """The synchronizer on host "sync", then one learner on host "learner"; the run ends by itself
    once the learner trained `steps` steps of tokens."""
    env = {**os.environ, "DDILOCO_TOKEN": "hosts-test-secret"}
    sync_dir, learner_dir = tmp / "sync", tmp / "learner-0"
    sync_dir.mkdir()
    learner_dir.mkdir()
    address_file = sync_dir / "address"
    sync_cmd = _ddiloco(
        "synchronizer",
        *("--host", net.address("sync"), "--port", "0", "--address-file", str(address_file)),
        *model_args(data, 1),
        *("--fragments", "2", "--sync-every", "4", "--overlap", "2", "--heartbeat", "0.2"),
        *("--tokens", str(steps * TOKENS_PER_STEP), "--max-learners", "1"),
        *("--checkpoint-dir", str(sync_dir), "--event-log", str(sync_dir / "events.jsonl")),
        *("--summary", str(sync_dir / "summary.json")),
    )
    with open(sync_dir / "stderr.log", "wb") as err:
        sync = net.popen("sync", sync_cmd, env=env, stdout=err, stderr=err)
    address = wait_for(lambda: address_file.is_file() and address_file.read_text(), 120, message="the address")
    assert address.startswith(net.address("sync") + ":")  # advertised at the host's own address
    learner_cmd = _ddiloco(
        "learner",
        *("--connect", address, "--id", "0"),
        *model_args(data, 1),
        *("--batch-size", "4", "--threads", "1", "--state-dir", str(learner_dir)),
        *learner_args,
    )
    with open(learner_dir / "stderr.log", "wb") as err:
        learner = net.popen("learner", learner_cmd, env=env, stdout=err, stderr=err)
    return sync, learner, sync_dir


def finish(sync, learner, tmp: Path, timeout: float) -> dict:
    codes = [p.wait(timeout=timeout) for p in (learner, sync)]
    logs = [(tmp / d / "stderr.log").read_text()[-3000:] for d in ("sync", "learner-0")]
    assert codes == [0, 0], (codes, *logs)
    summary = read_json(tmp / "sync" / "summary.json")
    assert summary["double_merged_steps"] == 0 and summary["books"]["0"]["tokens_merged"] > 0
    return summary


@pytest.mark.timeout(240)
def test_a_learner_on_another_host_is_merged(make_network, tmp_path: Path, shakespeare: str):
    net = make_network(["sync", "learner"], LINK)
    sync, learner, sync_dir = start_run(net, tmp_path, shakespeare, 24)
    finish(sync, learner, tmp_path, 200)
    kinds = [e["kind"] for e in read_events(sync_dir / "events.jsonl")]
    assert "join" in kinds and "merge" in kinds
    assert net.counters("learner")["sent_bytes"] > 0  # the learner's pushes crossed its link


@pytest.mark.timeout(300)
def test_a_learner_cut_off_is_declared_gone_and_rejoins_after_the_heal(make_network, tmp_path, shakespeare):
    net = make_network(["sync", "learner"], LINK)
    # at most 50 steps a second: 300 steps take 6 s or more, far longer than it takes to see a merge and cut
    # (cut off, it trains at most S x H = 16 steps: the budget waits for the heal)
    sync, learner, sync_dir = start_run(net, tmp_path, shakespeare, 300, "--min-step-seconds", "0.02")
    events = sync_dir / "events.jsonl"

    def merged_by_learner() -> list[dict]:
        return [e for e in read_events(events) if e["kind"] == "merge" and e["learners"] == [0]]

    wait_for(lambda: events.is_file() and merged_by_learner(), 120, message="a first merge")
    net.partition("learner")

    # gone after the failure timeout (6 heartbeats: 1.2 s) of silence; its link is cut meanwhile
    def declared_gone() -> list[dict]:
        return [e for e in read_events(events) if e["kind"] == "leave" and "heartbeat" in e["reason"]]

    wait_for(declared_gone, 120, message="the learner to be declared gone")
    time.sleep(1.0)  # the cut outlasts the declaration a little: the learner's retries meet a dead link
    healed_at = time.time()
    net.heal("learner")
    summary = finish(sync, learner, tmp_path, 240)  # the run ends only if the learner trained on
    after = [e for e in merged_by_learner() if e["t"] > healed_at]
    assert after, "no merge of the learner's work after the heal"
    joins = [e for e in read_events(events) if e["kind"] == "join" and e["learner"] == 0]
    assert len(joins) >= 2  # the first registration, and the return after the heal
    trained = sum(j["tokens"] for j in journals(tmp_path, 0))  # what the learner's own journal says it trained
    assert 0 < summary["books"]["0"]["tokens_merged"] <= trained
    assert net.counters("learner")["sent_dropped"] > 0  # the cut really dropped what it sent
