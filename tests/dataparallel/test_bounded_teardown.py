"""A failed generation's teardown is bounded (`dataparallel.worker.bounded`): a survivor whose gloo group
teardown never returned once held every later generation up until the run's limit. Real processes: one
whose work hangs ends itself with the restart code and its reason logged; one whose work returns goes on."""

from __future__ import annotations

import subprocess
import sys
import time

from ddiloco.dataparallel.worker import TEARDOWN_STUCK_EXIT

SCRIPT = """
import logging, sys, time
from ddiloco.dataparallel.worker import bounded
logging.basicConfig(level=logging.INFO, stream=sys.stderr)
bounded(float(sys.argv[1]), "a teardown", lambda: time.sleep(float(sys.argv[2])))
time.sleep(float(sys.argv[3]))  # what the process does next: a timer still running would end it here
print("went on", flush=True)
"""


def run(limit: float, work: float, after: float = 0.0) -> tuple[subprocess.CompletedProcess[str], float]:
    start = time.monotonic()
    out = subprocess.run(
        [sys.executable, "-c", SCRIPT, str(limit), str(work), str(after)], capture_output=True, text=True, timeout=120
    )
    return out, time.monotonic() - start


def test_work_that_hangs_past_its_bound_ends_the_process_to_be_restarted():
    out, seconds = run(0.5, 600.0)
    assert out.returncode == TEARDOWN_STUCK_EXIT and "went on" not in out.stdout
    assert "a teardown did not end within 0.5 s: exiting (code 75) to be restarted" in out.stderr
    assert seconds < 100  # its bound, not the work's 600 s (process start-up under load included)


def test_work_that_returns_within_its_bound_goes_on_and_its_timer_never_fires():
    out, _ = run(0.3, 0.0, after=1.5)  # the process outlives the bound after its work: the timer was cancelled
    assert out.returncode == 0 and out.stdout.strip() == "went on" and "did not end" not in out.stderr
