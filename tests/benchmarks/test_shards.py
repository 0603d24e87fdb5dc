"""benchmarks/shards.py: the shards' likeness by layout, and a quick run of the gap with each layout
that a rerun resumes without training again."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))

import shards  # noqa: E402

pytestmark = pytest.mark.timeout(300)


def test_interleaved_shards_are_alike_where_contiguous_ones_are_not(shakespeare):
    """A play read in quarters: the last quarter is the most like the validation text (its tail);
    dealt in blocks, every shard is about as like it as every other."""
    nats = shards.likeness(shakespeare, seq_len=32)
    spread = {layout: max(v) - min(v) for layout, v in nats.items()}
    assert min(nats["contiguous"]) == nats["contiguous"][-1]
    assert spread["interleaved"] < spread["contiguous"] / 3


def test_a_quick_run_reports_both_layouts_and_a_rerun_resumes(tmp_path, capsys, monkeypatch):
    out = tmp_path / "shards.json"
    assert shards.main(["--quick", "--json", "--out", str(out)]) == 0
    first = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert set(first["gap"]) == {"interleaved", "contiguous"}
    runs = json.loads(out.read_text())["runs"]
    assert len(runs) == 2 * 3  # two layouts, three methods, one seed
    monkeypatch.setattr(shards, "run_sim", lambda *a, **k: pytest.fail("a resumed run trained again"))
    assert shards.main(["--quick", "--json", "--out", str(out)]) == 0
    again = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert again["gap"] == first["gap"]
