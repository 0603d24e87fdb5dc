"""The synchronizer's background threads survive an unexpected exception (issue #32): it is logged
once with its traceback, the work is retried with backoff, and what the thread exists for still happens
once the cause is gone. Every wait is bounded in time."""

from __future__ import annotations

import logging
import threading

import pytest

from ddiloco.synchronizer.checkpoint import read_manifest
from ddiloco.synchronizer.timer import Timer

from ..support.runtime import wait_for
from .test_service import k1_sessions

pytestmark = pytest.mark.timeout(120)


def traced(caplog, logger: str) -> list[logging.LogRecord]:
    return [r for r in caplog.records if r.name == logger and r.exc_info]


def test_a_checkpoint_write_failing_with_a_non_oserror_holds_the_update_and_is_retried(
    tiny_task, tmp_path, monkeypatch, caplog
):
    """safetensors raises SafetensorError (not an OSError) at the open-file limit; the writer used to
    die on it, holding every update from then on."""
    from safetensors import SafetensorError

    from ddiloco.synchronizer import checkpoint
    from ddiloco.wire.reassembly import Reassembler
    from ddiloco.wire.timeouts import Timeouts

    caplog.set_level(logging.INFO, logger="ddiloco.synchronizer.commit")
    real_save = checkpoint.save_file
    full = threading.Event()
    failures = []

    def save_file(*args, **kwargs):
        if full.is_set():
            failures.append(1)
            raise SafetensorError("Too many open files (os error 24)")
        return real_save(*args, **kwargs)

    # sessions that send no heartbeats: declared gone only after 30 s, however loaded the machine
    with k1_sessions(tiny_task, tmp_path, timeouts=Timeouts.derive(5.0)) as (service, sessions, push):
        monkeypatch.setattr(checkpoint, "save_file", save_file)

        def updates_to_0() -> list[int]:
            versions, reassembler = [], Reassembler(1 << 30)
            while (frame := sessions[0].outbox.get(0.5)) is not None:
                msg = reassembler.feed(frame)
                if msg is not None and msg.head.get("kind") == "update":
                    versions.append(msg.head["version"])
            return versions

        assert 1 not in updates_to_0()  # the join update (version 0) is gone from the queue
        full.set()
        assert push(0) == {"ok": True}
        wait_for(lambda: len(failures) >= 3, 30, message="three failed checkpoint writes")
        writer = service.commit._thread
        assert writer.is_alive(), "the checkpoint writer died"
        with service.cond:
            assert service.core.versions[0] == 1 and service.commit.committed.get(0) == 0
            assert {(f, v) for f, v, _ in service.commit.held} == {(0, 1)}
        assert 1 not in updates_to_0()  # held while version 1 is not durable
        assert read_manifest(tmp_path / "ckpt" / "manifest.json")["fragments"]["0"]["version"] == 0

        full.clear()  # the cause goes away
        wait_for(lambda: service.commit.committed.get(0) == 1, 30, message="the retried checkpoint write")
        assert writer.is_alive()
        assert 1 in wait_for(updates_to_0, 10, message="the held update")
        assert read_manifest(tmp_path / "ckpt" / "manifest.json")["fragments"]["0"]["version"] == 1
        assert (tmp_path / "ckpt" / "fragments" / "p0000-v00000001.safetensors").is_file()
        assert not service.commit.held
    errors = traced(caplog, "ddiloco.synchronizer.commit")
    assert len(errors) == 1, [r.getMessage() for r in errors]  # the traceback once, not once per retry
    assert isinstance(errors[0].exc_info[1], SafetensorError)
    assert "checkpoint writer" in errors[0].getMessage()
    assert any("recovered" in r.getMessage() for r in caplog.records if r.name == "ddiloco.synchronizer.commit")


def test_the_timer_survives_a_failing_tick_and_a_failing_deadline(caplog):
    caplog.set_level(logging.INFO, logger="ddiloco.synchronizer.timer")
    cond = threading.Condition()
    closed = threading.Event()
    ticks, deadlines = [], []

    def tick():
        ticks.append(1)
        if len(ticks) <= 3:
            raise RuntimeError("a bug in a tick")

    def next_deadline():
        deadlines.append(1)
        if len(deadlines) == 1:
            raise KeyError("a bug in the deadline")
        return None

    timer = Timer(cond, tick, next_deadline, lambda: 0.0, closed.is_set, period=0.05)
    timer.start()
    try:
        wait_for(lambda: len(deadlines) >= 3, 30, message="ticks after the failures")
        assert timer._thread.is_alive()
    finally:
        closed.set()
        with cond:
            cond.notify_all()
        timer.join(10)
    assert not timer._thread.is_alive()
    errors = traced(caplog, "ddiloco.synchronizer.timer")
    assert sorted(type(r.exc_info[1]).__name__ for r in errors) == ["KeyError", "RuntimeError"]


def test_the_stream_guard_survives_a_failing_check(caplog, monkeypatch):
    from ddiloco.synchronizer.streams import StreamGuard
    from ddiloco.wire.timeouts import Timeouts

    caplog.set_level(logging.INFO, logger="ddiloco.synchronizer.streams")
    guard = StreamGuard(Timeouts.derive(0.05), lambda method, reason: None)
    checks = []

    def check(now):
        checks.append(now)
        if len(checks) <= 2:
            raise RuntimeError("a bug in a check")
        return []

    monkeypatch.setattr(guard, "check", check)
    guard.open("Push", context=type("Ctx", (), {"cancel": lambda self: None})())
    try:
        wait_for(lambda: len(checks) >= 4, 30, message="checks after the failures")
        assert guard._thread is not None and guard._thread.is_alive()
    finally:
        guard.shutdown()
    assert guard._thread is not None
    guard._thread.join(10)
    assert not guard._thread.is_alive()
    assert len(traced(caplog, "ddiloco.synchronizer.streams")) == 1
