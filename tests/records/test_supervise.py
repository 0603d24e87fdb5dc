"""Background threads under `run_supervised`: backoff that doubles to a cap, one traceback per distinct
error, repeats rate-limited, and exceptions that are not `Exception` never swallowed."""

from __future__ import annotations

import logging

import pytest

from ddiloco.records.supervise import MAX_SIGNATURES, Supervisor, run_supervised


def traced(caplog, logger: str) -> list[logging.LogRecord]:
    return [r for r in caplog.records if r.name == logger and r.exc_info]


def test_the_supervisor_backs_off_logs_repeats_briefly_and_never_swallows_baseexceptions(caplog):
    log = logging.getLogger("ddiloco.test.supervise")
    caplog.set_level(logging.INFO, logger=log.name)
    supervisor = Supervisor("worker", log, first=0.1, cap=0.5)
    waits: list[float] = []
    steps = iter([ValueError("x")] * 5 + [True, ValueError("x"), False])

    def step() -> bool:
        outcome = next(steps)
        if isinstance(outcome, Exception):
            raise outcome
        return outcome

    run_supervised(step, lambda seconds: waits.append(seconds) or True, supervisor)
    assert waits == [0.1, 0.2, 0.4, 0.5, 0.5, 0.1]  # doubling to the cap, back to the start after a success
    assert len(traced(caplog, log.name)) == 1
    assert any("recovered after 5 failures" in r.getMessage() for r in caplog.records)
    repeats = [r for r in caplog.records if "failed again" in r.getMessage()]
    assert len(repeats) == 3  # the burst; the fifth failure's line is dropped (and counted)

    def die() -> bool:
        raise SystemExit(3)

    with pytest.raises(SystemExit):
        run_supervised(die, lambda seconds: True, supervisor)
    assert caplog.records[-1].levelno == logging.CRITICAL and "worker" in caplog.records[-1].getMessage()

    stopped = []

    def fail() -> bool:
        raise ValueError("x")

    run_supervised(fail, lambda seconds: stopped.append(seconds) and False, supervisor)
    assert len(stopped) == 1  # the owner is closing: no retry
    with pytest.raises(ValueError):
        Supervisor("bad", log, first=0.0)


def test_distinct_errors_past_the_limit_are_short_lines(caplog):
    log = logging.getLogger("ddiloco.test.signatures")
    caplog.set_level(logging.INFO, logger=log.name)
    supervisor = Supervisor("worker", log, first=0.1, cap=0.1)
    for i in range(MAX_SIGNATURES + 2):
        try:
            exec(compile("\n" * i + "raise KeyError('k')", f"<step {i}>", "exec"))  # a new place each time
        except KeyError as exc:
            supervisor.failed(exc)
    assert len(traced(caplog, log.name)) == MAX_SIGNATURES
    assert supervisor.total == MAX_SIGNATURES + 2 and supervisor.failures == MAX_SIGNATURES + 2
