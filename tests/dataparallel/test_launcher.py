"""The launcher's handling of chaos and crashes, on stand-in processes (`sleep`, `exit 1`) that it
signals and ends by PID: a traced kill holds a worker down until its restart, SIGSTOP freezes one
and SIGCONT resumes it, a worker that keeps crashing at start ends the run with an error, and so
does a job whose workers run but never form a generation (hung before their hello, or unable to
reach each other), after `stall_limit` instead of the 24 h time limit."""

from __future__ import annotations

import signal
import sys
import time
from pathlib import Path

import pytest

from ddiloco.chaos.injector import ChaosEvent, ChaosSettings
from ddiloco.dataparallel.config import DataParallelConfig
from ddiloco.dataparallel.launcher import MAX_CRASHES, Launcher
from ddiloco.dataparallel.rendezvous import Membership
from ddiloco.dataparallel.storeauth import read_secret


@pytest.fixture()
def launcher(tmp_path: Path):
    config = DataParallelConfig(tmp_path, method="elastic-ddp", workers=2, tokens=1000, learner_down=0.0)
    config = DataParallelConfig(**{**config.__dict__, "chaos": ChaosSettings(straggle=30.0)})
    made = Launcher(config)
    yield made
    made.procs.stop_all(grace=2.0)
    made.events.close()
    made.log.close()


def stand_in(launcher: Launcher, slot: int, code: str = "import time; time.sleep(60)") -> None:
    s = launcher.slots[slot]
    s.child = launcher.procs.start(f"stand-in-{slot}", [sys.executable, "-c", code])
    s.state, s.restart_at, s.started_at = "running", None, launcher.elapsed()


def wait_exit(launcher: Launcher, slot: int) -> None:
    child = launcher.slots[slot].child
    assert child is not None
    child.popen.wait(timeout=10)


def test_a_traced_kill_holds_the_worker_down_until_its_restart(launcher: Launcher, monkeypatch):
    started: list[int] = []  # (worker 0 was never started here: it is due at once)
    monkeypatch.setattr(launcher, "_start", lambda slot: started.append(slot.id))
    stand_in(launcher, 1)
    launcher._apply(ChaosEvent(0.0, "kill_learner", 1))
    wait_exit(launcher, 1)
    assert launcher.slots[1].child.poll() == -signal.SIGKILL
    launcher._check_workers()
    assert launcher.slots[1].state == "down" and launcher.slots[1].restart_at is None and 1 not in started
    launcher._apply(ChaosEvent(1.0, "restart_learner", 1))
    launcher._check_workers()
    assert 1 in started


def test_sigstop_freezes_a_worker_and_it_is_not_ready_until_resumed(launcher: Launcher):
    stand_in(launcher, 0)
    launcher._apply(ChaosEvent(0.0, "sigstop", -1))
    assert launcher.slots[0].state == "straggling" and not launcher._ready(launcher.slots[0])
    assert launcher._alive(launcher.slots[0])  # still a member of its generation until its peers time out
    launcher.straggling[0] = 0.0
    launcher._resume_stragglers()
    assert launcher.slots[0].state == "running" and not launcher.straggling


def test_a_worker_that_keeps_crashing_at_start_ends_the_run(launcher: Launcher, monkeypatch):
    monkeypatch.setattr(launcher, "_start", lambda slot: stand_in(launcher, slot.id, "raise SystemExit(3)"))
    stand_in(launcher, 0, "raise SystemExit(3)")
    for _ in range(MAX_CRASHES * 20):  # bounded: each round waits for the stand-in's exit
        wait_exit(launcher, 0)
        launcher._check_workers()
        if launcher.error is not None:
            break
        time.sleep(0.01)
    assert launcher.error is not None and "keeps crashing" in launcher.error
    assert launcher.slots[0].state == "failed"


@pytest.fixture()
def ddp_launcher(tmp_path: Path):
    config = DataParallelConfig(tmp_path, workers=2, tokens=1000, stall_limit=10.0, time_limit=120.0)
    made = Launcher(config)
    yield made
    made.procs.stop_all(grace=2.0)
    made.events.close()
    made.log.close()


def test_workers_that_never_say_they_are_ready_end_the_run_at_the_stall_limit(tmp_path: Path, monkeypatch):
    """Real processes that hang before their hello (as a worker stuck in start-up does): the run
    ends with an error naming them, not at the time limit (before the limit it waited 24 h)."""
    config = DataParallelConfig(tmp_path, workers=2, tokens=1000, stall_limit=1.0, time_limit=120.0)
    launcher = Launcher(config)
    monkeypatch.setattr(launcher, "_start", lambda slot: stand_in(launcher, slot.id))
    launcher.run()  # bounded by the time limit, whose error would fail the assertion below
    assert launcher.error is not None and launcher.error.startswith("no generation formed in 1 s"), launcher.error
    assert "worker(s) 0, 1 never said they were ready" in launcher.error
    for slot in launcher.slots:  # every stand-in ended by the launcher on its way out
        assert slot.child is not None and slot.child.poll() is not None


def test_the_stall_clock_waits_for_a_down_worker_and_a_formed_generation_clears_it(ddp_launcher: Launcher):
    launcher = ddp_launcher
    stand_in(launcher, 0)  # worker 1 is down: ddp waits for it, and that wait is no stall
    launcher._count_stall(100.0)
    assert launcher.unformed_for == 0.0 and launcher.error is None
    stand_in(launcher, 1)
    launcher._count_stall(6.0)
    assert launcher.unformed_for == 6.0 and launcher.error is None
    secret = read_secret(launcher.secret_file)
    members = [Membership(launcher.coordinator.port, m, timeout=10.0, secret=secret) for m in (0, 1)]
    for m, member in enumerate(members):
        child = launcher.slots[m].child
        assert child is not None
        member.hello(child.pid)
    launcher._open([0, 1])
    members[0].mark_formed(launcher.coordinator.generation, {"members": [0, 1]})
    launcher._watch_formed()  # as the run's loop does each tick, before counting
    launcher._count_stall(6.0)
    assert launcher.unformed_for == 0.0  # a formed generation: the clock starts again at zero
    launcher._open([0, 1])  # the next one, which never forms: its members said hello, then nothing
    launcher._count_stall(6.0)
    assert launcher.error is None
    launcher._count_stall(6.0)
    assert launcher.error is not None and "generation 2 of workers 0, 1 never formed" in launcher.error
