"""A learner knows when to stop (issue 46): without its synchronizer it trains on alone for at most
S x H steps, waits without training until --orphan-timeout seconds after the last answer, then ends
with exit code 3, its summary printed and its journal kept; a synchronizer back within that time
finds it training on; one that comes back to a finished run (or starts after it) stops at once.

Real processes on loopback, a real kill -9; every wait bounded. Before this, the learner of each
process test trained on alone until the test's own timeout killed it.
"""

from __future__ import annotations

import json
import signal
import time
from pathlib import Path

import pytest

from ddiloco.learner.ending import EXIT_ORPHANED, EndWatch
from ddiloco.wire import runend

from ..support.processes import events, journals, start_learner, start_synchronizer, wait_exit
from ..support.runtime import wait_for

pytestmark = pytest.mark.timeout(180)
FAILURE = 6 * 0.2  # start_synchronizer's --heartbeat 0.2
STEP = 0.02  # --min-step-seconds: steps are never faster than this (a loaded machine only slows them)
SOLO = 4 * 4  # S x H: the default --max-staleness 4 times start_synchronizer's --sync-every 4


# --- the bound, without processes -------------------------------------------------------------------
def test_the_watch_idles_a_cut_off_learner_after_s_h_steps_and_ends_it_at_the_orphan_timeout():
    watch = EndWatch(0, orphan_timeout=60.0, solo_steps=SOLO, failure=1.0, where="/state")
    now = time.monotonic()
    assert watch.check(10, 100, contact=now, address="a:1") is None  # in contact: step 10 counted
    assert not watch.idle(10 + SOLO, now)
    stale = now - 2.0  # silent past the failure timeout: alone from step 10
    assert watch.check(10 + SOLO, 100, contact=stale, address="a:1") is None  # well within 60 s
    assert not watch.idle(10 + SOLO - 1, stale) and watch.idle(10 + SOLO, stale)
    ending = watch.check(10 + SOLO, 100, contact=now - 61.0, address="a:1")
    assert ending is not None and ending.code == EXIT_ORPHANED
    assert "orphan timeout" in ending.reason and "/state" in ending.reason and f"{SOLO} steps alone" in ending.reason
    back = EndWatch(0, orphan_timeout=60.0, solo_steps=SOLO, failure=1.0, where=None)
    back.check(10, 0, contact=stale, address="a:1")
    assert back.check(40, 0, contact=time.monotonic(), address="a:1") is None  # an answer again: counted anew
    assert not back.idle(40 + SOLO - 1, stale)


def test_one_lost_shard_never_idles_a_learner_another_shard_still_answers():
    """Cut off from shard 1 only, its work on shard 0's fragments is still merged: training on, the
    others never stall (tests/hosts/test_partitions.py, a shard cut off from every learner). Cut off
    from both, it idles S x H steps after the last answer from either."""
    watch = EndWatch(0, orphan_timeout=60.0, solo_steps=SOLO, failure=1.0, where=None)
    now = time.monotonic()
    lost, answering = now - 2.0, now  # shard 1 silent past the failure timeout; shard 0 answers
    for step in range(10, 10 + 3 * SOLO):
        assert watch.check(step, 0, contact=lost, address="shard1:1", newest=answering) is None
        assert not watch.idle(step, answering)
    last_heard = 10 + 3 * SOLO - 1
    assert watch.heard_step == last_heard and watch.contact_step < last_heard
    assert watch.check(last_heard + SOLO, 0, contact=lost, address="shard1:1", newest=lost) is None
    assert not watch.idle(last_heard + SOLO - 1, lost) and watch.idle(last_heard + SOLO, lost)
    ending = watch.check(last_heard + SOLO, 0, contact=now - 61.0, address="shard1:1", newest=answering)
    assert ending is not None and ending.code == EXIT_ORPHANED  # one shard silent past the orphan timeout


def test_a_finished_run_ends_the_learner_zero_only_when_its_work_was_counted():
    counted = EndWatch(1, 60.0, SOLO, 1.0, None)
    counted.finished[0] = {"finished": True, "books": {"1": {"merged_position": 40}}}
    ending = counted.check(5, 40, time.monotonic(), "a:1")
    assert ending is not None and ending.code == 0
    behind = EndWatch(1, 60.0, SOLO, 1.0, None)
    behind.finished[0] = {"finished": True, "books": {"1": {"merged_position": 40}}}
    ending = behind.check(5, 41, time.monotonic(), "a:1")
    assert ending is not None and ending.code == EXIT_ORPHANED and "past data position 40" in ending.reason


# --- real processes ---------------------------------------------------------------------------------
def _learner(procs, tmp: Path, data: str, learners: int, address: str, m: int, *extra: str):
    return start_learner(procs, tmp, data, learners, address, m, "--min-step-seconds", str(STEP), "--json", *extra)


def _summary(tmp: Path, m: int) -> dict:
    lines = [ln for ln in (tmp / f"learner-{m}" / "stdout.log").read_text().splitlines() if ln.startswith("{")]
    assert lines, f"learner {m} printed no summary line"
    return json.loads(lines[-1])


def _merged(tmp: Path, m: int) -> bool:
    return any(e.get("kind") == "merge" and m in e.get("learners", []) for e in events(tmp))


def _log(tmp: Path, m: int) -> str:
    return (tmp / f"learner-{m}" / "stderr.log").read_text()[-3000:]


@pytest.mark.parametrize("bound", ["orphan timeout", "staleness bound"])
def test_a_learner_whose_synchronizer_is_killed_ends_within_its_bound(procs, tmp_path, shakespeare, bound):
    # "orphan timeout": S x H far away (S = 1000), it trains for the 3 s; "staleness bound": it trains
    # S x H = 16 steps, then waits without training until its 6 s are up
    extra = ("--max-staleness", "1000") if bound == "orphan timeout" else ()
    sync, _ = start_synchronizer(procs, tmp_path, shakespeare, 1, 0, *extra)
    address = f"@{tmp_path / 'sync' / 'address'}"
    timeout = "3" if bound == "orphan timeout" else "6"
    learner = _learner(procs, tmp_path, shakespeare, 1, address, 0, "--orphan-timeout", timeout)
    wait_for(lambda: _merged(tmp_path, 0), 90, message="a merge of learner 0")
    steps_at_kill = max(j["steps"] for j in journals(tmp_path, 0))
    procs.kill_tree(sync)  # kill -9, and no restart: the synchronizer never comes back
    assert wait_exit([learner], 120) == [EXIT_ORPHANED], _log(tmp_path, 0)
    summary = _summary(tmp_path, 0)
    assert summary["exit_code"] == EXIT_ORPHANED and "orphan timeout" in summary["ended"], summary
    assert "lost its synchronizer" in _log(tmp_path, 0)
    (journal,) = journals(tmp_path, 0)  # kept on disk, saying how it ended
    assert journal["state"] == "orphaned" and journal["steps"] == summary["steps"]
    if bound == "staleness bound":  # steps never come faster than STEP: a bound, also under load
        assert summary["steps"] - steps_at_kill <= SOLO + FAILURE / STEP + 5, (summary["steps"], steps_at_kill)
        assert "without training" in _log(tmp_path, 0)


def test_a_synchronizer_back_within_the_orphan_timeout_finds_its_learner_training_on(procs, tmp_path, shakespeare):
    budget = 400 * 64
    sync, _ = start_synchronizer(procs, tmp_path, shakespeare, 1, 0, "--tokens", str(budget))
    address = f"@{tmp_path / 'sync' / 'address'}"
    learner = _learner(procs, tmp_path, shakespeare, 1, address, 0, "--orphan-timeout", "120")
    wait_for(lambda: _merged(tmp_path, 0), 90, message="a merge of learner 0")
    procs.kill_tree(sync)  # a crash: its supervisor (here the test) starts it again from its checkpoint
    wait_for(lambda: "without training" in _log(tmp_path, 0), 60, message="learner 0 to wait at S x H steps alone")
    idle_at = max(j["steps"] for j in journals(tmp_path, 0))
    sync, _ = start_synchronizer(procs, tmp_path, shakespeare, 1, 0, "--tokens", str(budget))
    assert wait_exit([learner, sync], 120) == [0, 0], _log(tmp_path, 0)
    summary = _summary(tmp_path, 0)
    assert summary["ended"] is None and summary["steps"] > idle_at  # it trained on, to the run's end
    assert "answers again" in _log(tmp_path, 0)


def test_a_learner_that_comes_back_to_a_finished_run_stops_at_once(procs, tmp_path, shakespeare):
    budget = 300 * 64
    sync, _ = start_synchronizer(procs, tmp_path, shakespeare, 2, 0, "--tokens", str(budget))
    address_file = tmp_path / "sync" / "address"
    address = f"@{address_file}"
    learners = [_learner(procs, tmp_path, shakespeare, 2, address, m) for m in (0, 1)]
    wait_for(lambda: _merged(tmp_path, 1), 90, message="a merge of learner 1")
    learners[1].signal(signal.SIGSTOP)  # cut off across the end of the run: learner 0 carries it
    assert wait_exit([learners[0], sync], 120) == [0, 0], _log(tmp_path, 0)
    mark = runend.read(address_file)
    assert mark is not None, "the finished synchronizer left no mark beside its address file"
    learners[1].signal(signal.SIGCONT)  # back to a closed port: it must not train on alone
    (code,) = wait_exit([learners[1]], 60)
    assert code is not None, "learner 1 trains on alone after its run finished"
    summary = _summary(tmp_path, 1)
    counted = runend.counted_position(mark, 1)
    assert code == summary["exit_code"] == (0 if counted >= summary["position"] else EXIT_ORPHANED), summary
    assert "finished" in summary["ended"]
    # a learner (re)started after the end (a requeued job) stops at once, without waiting to connect
    late = start_learner(procs, tmp_path, shakespeare, 2, address, 1, "--connect-timeout", "600", "--json")
    assert wait_exit([late], 60) == [0], _log(tmp_path, 1)
    assert "nothing to train" in _summary(tmp_path, 1)["ended"]
