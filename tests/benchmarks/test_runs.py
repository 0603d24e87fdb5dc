"""benchmarks/runs.py: a benchmark's run records the machine's load before and after it, so that a run
made beside other work can be told apart (issue #44: runs on a quiet machine, or redone)."""

from __future__ import annotations

import os
import sys
from pathlib import Path

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
