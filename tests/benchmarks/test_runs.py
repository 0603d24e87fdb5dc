"""benchmarks/runs.py: a benchmark's run records the machine's load before and after it, so that a run
made beside other work can be told apart (issue #44: runs on a quiet machine, or redone)."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))

from runs import ddiloco_run  # noqa: E402


def test_a_run_records_the_machines_load_before_and_after(tmp_path, shakespeare):
    args = ["--model-size", "tiny", "--seq-len", "16", "--batch-size", "4", "--tokens", "2000", "--learners", "2"]
    result = ddiloco_run([*args, "--data", shakespeare], tmp_path / "run", "a tiny sim", command="sim")
    assert result["method"] == "decoupled" and result["tokens"] >= 2000  # the run's own summary, as before
    for moment in ("before", "after"):
        load = result["load"][moment]
        assert load["cpus"] == os.cpu_count() and 0 <= load["load_1min"] < 10_000
    assert 0 <= result["load"]["others_cpu_share"] <= 1 and isinstance(result["load"]["quiet"], bool)


def test_others_share_is_the_machines_busy_cpu_less_the_runs_own_over_the_cpu_time_there_was():
    from runs import others_share

    assert others_share(busy_seconds=20.0, own_seconds=19.0, wall_seconds=10.0, cpus=2) == pytest.approx(0.05)
    assert others_share(busy_seconds=20.0, own_seconds=10.0, wall_seconds=10.0, cpus=2) == pytest.approx(0.5)
    assert others_share(busy_seconds=5.0, own_seconds=6.0, wall_seconds=10.0, cpus=2) == 0.0  # clock ticks' rounding
    assert others_share(busy_seconds=50.0, own_seconds=0.0, wall_seconds=10.0, cpus=2) == 1.0
    assert others_share(busy_seconds=1.0, own_seconds=0.0, wall_seconds=0.0, cpus=2) == 0.0


def test_a_run_beside_a_process_that_is_not_its_own_is_not_quiet(tmp_path, shakespeare):
    """A busy loop started before the run and waited for only after it: its CPU is someone else's, so
    the run that shared the machine with it is marked beside other work, however loaded the machine."""
    import subprocess

    from runs import QUIET_SHARE

    burner = subprocess.Popen(
        [sys.executable, "-c", "import time\nend = time.time() + 600\nwhile time.time() < end: pass"]
    )
    try:
        args = ["--model-size", "tiny", "--seq-len", "16", "--batch-size", "4", "--tokens", "4000", "--learners", "2"]
        result = ddiloco_run([*args, "--data", shakespeare], tmp_path / "run", "a tiny sim", command="sim")
    finally:
        burner.kill()
        burner.wait()
    assert result["load"]["others_cpu_share"] > QUIET_SHARE and result["load"]["quiet"] is False
