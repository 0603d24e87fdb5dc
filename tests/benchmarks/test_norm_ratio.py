"""`benchmarks/norm_ratio.py` measures honest outer gradients against the norm bound with the inner
optimizer it is given, each at its own lr (AdamW's lrs scaled by the two defaults' ratio)."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_norm_ratio_runs_the_optimizer_it_is_given_at_its_own_lr(shakespeare: str):
    rows = {}
    for optimizer in ("adamw", "muon"):
        out = subprocess.run(
            [sys.executable, str(ROOT / "benchmarks" / "norm_ratio.py"), "--quick", "--json"]
            + ["--inner-optimizer", optimizer, "--data", shakespeare],
            capture_output=True,
            text=True,
            timeout=500,
        )
        assert out.returncode == 0, out.stderr[-3000:]
        [rows[optimizer]] = json.loads(out.stdout.strip().splitlines()[-1])["rows"]
    assert rows["adamw"]["inner_lr"] == 3e-3 and rows["muon"]["inner_lr"] == 1.2e-2
    for optimizer, row in rows.items():
        assert row["inner_optimizer"] == optimizer and row["contributions"] > 0 and row["rejected_contributions"] == 0
        assert 0 < row["median_ratio"] <= row["max_ratio"] < row["bound"] == 10.0
    assert rows["adamw"]["eval_loss"] != rows["muon"]["eval_loss"]  # two optimizers, two runs
