"""The critical batch benchmark (`benchmarks/critical_batch.py`): McCandlish et al.'s fit by hand, and
the quick run's plumbing (its figures are reported in docs/results.md, never asserted)."""

import json
import math
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
import critical_batch  # noqa: E402


def test_the_fit_recovers_s_min_and_b_crit_from_exact_steps():
    # S(B) = S_min (1 + B_crit / B) with S_min 10, B_crit 32: 90, 50, 30, 20 steps
    got = critical_batch.fit([4, 8, 16, 32], [90.0, 50.0, 30.0, 20.0])
    assert got["s_min"] == pytest.approx(10.0) and got["b_crit"] == pytest.approx(32.0)
    assert got["e_min"] == pytest.approx(320.0) and got["r2"] == pytest.approx(1.0)
    # steps that fall faster than 1/B leave no floor (a negative S_min): no B_crit can be read off
    assert math.isinf(critical_batch.fit([4, 8, 16], [75.0, 35.0, 15.0])["b_crit"])


def test_a_target_is_crossed_between_the_evaluations_around_it():
    points = [[100.0, 3.0], [200.0, 2.0], [300.0, 1.5]]
    assert critical_batch.crossing(points, 2.5) == pytest.approx(150.0)
    assert critical_batch.crossing(points, 1.75) == pytest.approx(250.0)
    assert critical_batch.crossing(points, 3.5) == 100.0  # reached by the first evaluation
    assert critical_batch.crossing(points, 1.0) is None


def test_quick_json_has_a_bracketed_lr_per_batch_and_a_fit_per_target(capsys, shakespeare, tmp_path):
    out = tmp_path / "cb.json"
    args = ["--quick", "--json", "--data", shakespeare, "--out", str(out), "--targets", "3.0", "2.8"]
    assert critical_batch.main(args) == 0
    result = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    batches = critical_batch.QUICK["batches"]
    assert sorted(int(b) for b in result["lrs"]) == batches
    for b in result["lrs"].values():  # the chosen lr strictly inside its grid, or said not to be
        assert (b["grid"][0] < b["lr"] < b["grid"][-1]) == b["bracketed"]
    assert [t["target"] for t in result["targets"]] == [3.0, 2.8]
    saved = json.loads(out.read_text())
    seq_len = saved["config"]["seq_len"]
    for t in result["targets"]:  # each batch's steps are its chosen lr's run's tokens to the target
        for b in t["batches_reached"]:
            run = next(
                r for r in saved["runs"] if (r["batch"], r["lr"], r["seed"]) == (b, result["lrs"][str(b)]["lr"], 0)
            )
            assert t["steps"][str(b)][0] * b * seq_len == pytest.approx(run["reached"][str(t["target"])])
    runs = len(saved["runs"])
    assert critical_batch.main(args) == 0  # resumed: every run from the file, none again
    again = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert again == result and len(json.loads(out.read_text())["runs"]) == runs
