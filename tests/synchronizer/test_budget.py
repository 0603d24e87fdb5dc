"""--duration counts from the run's first start, across synchronizer restarts (issue #32: a restart
used to restart the clock, so a 16 s run killed at 8 s stopped 26 s after it began)."""

import os
import signal
import time

import pytest

from ddiloco.records.atomic import atomic_write_json, read_json
from ddiloco.records.events import read_events
from ddiloco.synchronizer import ticks
from ddiloco.synchronizer.budget import RunBudget
from ddiloco.synchronizer.server import build_service
from ddiloco.synchronizer.settings import ServiceSettings

from ..support.processes import start_synchronizer, status, wait_exit
from ..support.runtime import ALGORITHM, FAST, wait_for

pytestmark = pytest.mark.timeout(90)


def build(task, tmp_path, duration: float):
    """A synchronizer service (not serving, timer not started) on `tmp_path / "ckpt"`."""
    params = {n: p.detach() for n, p in task.build_model(0).named_parameters()}
    settings = ServiceSettings(timeouts=FAST, duration=duration)
    return build_service(params, ALGORITHM, settings, task.embedding_names, checkpoint_dir=tmp_path / "ckpt")


def age_checkpoint(tmp_path, seconds: float | None) -> float | None:
    """Make the checkpoint's run `seconds` older (None: drop the start, as a checkpoint from before it was
    saved); returns the run's first start as the checkpoint now says."""
    path = tmp_path / "ckpt" / "manifest.json"
    manifest = read_json(path)
    if seconds is None:
        del manifest["ledger"]["started_wall"]
        started = None
    else:
        started = manifest["ledger"]["started_wall"] = manifest["ledger"]["started_wall"] - seconds
    atomic_write_json(path, manifest)
    return started


def tick(service) -> None:
    with service.cond:
        ticks.tick(service)


def test_the_budget_counts_progress_and_the_end_from_the_start_it_is_given():
    budget = RunBudget(None, 100.0, started_wall=1000.0)
    assert budget.progress(0, 1050.0) == pytest.approx(0.5)
    assert budget.exhausted(0, 1099.0) is None
    assert budget.exhausted(0, 1100.0) == "duration of 100 s reached"


def test_a_restarted_synchronizer_keeps_the_first_start(tiny_task, tmp_path):
    first = build(tiny_task, tmp_path, 16.0)
    started = first.ledger.started_wall
    first.close()
    time.sleep(0.3)  # the restart's own clock reads later than the first start
    restored = build(tiny_task, tmp_path, 16.0)
    try:
        assert restored.restored_from is not None
        assert restored.ledger.started_wall == started
        assert restored.budget.started_wall == started
    finally:
        restored.close()


def test_a_restart_counts_progress_from_the_first_start(tiny_task, tmp_path):
    build(tiny_task, tmp_path, 400.0).close()
    started = age_checkpoint(tmp_path, 100.0)
    restored = build(tiny_task, tmp_path, 400.0)
    try:
        assert restored.budget.started_wall == started
        assert 0.25 <= restored.progress() < 0.5  # 100 s of 400 have passed (0 if the clock restarted)
        tick(restored)
        assert not restored.stopping
    finally:
        restored.close()


def test_a_restart_after_the_duration_has_passed_stops_at_once(tiny_task, tmp_path):
    build(tiny_task, tmp_path, 16.0).close()
    age_checkpoint(tmp_path, 100.0)
    restored = build(tiny_task, tmp_path, 16.0)
    try:
        assert restored.progress() == 1.0
        tick(restored)  # the first timer tick
        assert restored.stopping and restored.stop_reason == "duration of 16 s reached"
    finally:
        restored.close()


def test_a_checkpoint_without_the_first_start_loads_and_counts_from_the_restart(tiny_task, tmp_path):
    build(tiny_task, tmp_path, 16.0).close()
    age_checkpoint(tmp_path, None)
    before = time.time()
    restored = build(tiny_task, tmp_path, 16.0)
    after = time.time()
    try:
        assert restored.restored_from is not None
        assert before <= restored.budget.started_wall == restored.ledger.started_wall <= after
        tick(restored)
        assert not restored.stopping
    finally:
        restored.close()
    # the next checkpoint holds the start again
    assert read_json(tmp_path / "ckpt" / "manifest.json")["ledger"]["started_wall"] == restored.ledger.started_wall


def test_a_killed_synchronizer_process_restarts_with_the_duration_counted_from_the_first_start(
    procs, tmp_path, shakespeare
):
    duration = 8.0
    sync, _ = start_synchronizer(procs, tmp_path, shakespeare, 1, 0, "--duration", str(duration))
    started = read_json(tmp_path / "sync" / "manifest.json")["ledger"]["started_wall"]
    wait_for(lambda: time.time() >= started + 3.0, 10, message="3 s into the run")
    os.kill(sync.pid, signal.SIGKILL)
    sync.popen.wait(10)
    killed = time.time()
    sync, address = start_synchronizer(procs, tmp_path, shakespeare, 1, 0, "--duration", str(duration))
    before = time.time()
    st = wait_for(lambda: status(address), 10, message="the restarted synchronizer's status")
    after = time.time()
    assert st["restored_from"] is not None and st["started_wall"] == started
    # elapsed by the budget: from the first start (a restarted clock reads less than after - killed)
    elapsed = st["progress"] * duration
    assert min(before - started, duration) - 0.5 <= elapsed <= after - started + 0.5, (elapsed, killed - started)
    # with no learners the run ends by its duration and the process exits by itself
    assert wait_exit([sync], 30) == [0]
    stops = [e["reason"] for e in read_events(tmp_path / "sync" / "events.jsonl") if e["kind"] == "stop"]
    assert stops == [f"duration of {duration:g} s reached"]
