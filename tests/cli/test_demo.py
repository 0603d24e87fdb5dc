"""`ddiloco demo`: both methods on one failure trace, side by side, with the report written."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from ddiloco.cli import _register, app
from ddiloco.cli.demo import interpretation, loss_at
from ddiloco.records.rundir import load_run

_register()


def test_demo_compares_both_methods_on_the_same_failures(shakespeare, tmp_path):
    out = tmp_path / "demo"
    result = CliRunner().invoke(
        app,
        [
            "demo",
            "--model-size",
            "tiny",
            "--tokens",
            "12000",
            "--data",
            shakespeare,
            "--out",
            str(out),
            "--quiet",
            "--json",
        ],
        catch_exceptions=False,
    )
    assert result.exit_code == 0, result.output
    both = json.loads(result.stdout.strip().splitlines()[-1])
    d, e = both["decoupled"], both["elastic-ddp"]
    assert d["method"] == "decoupled" and e["method"] == "elastic-ddp"
    assert d["tokens"] >= 12000 and e["tokens"] >= 12000
    runs = [load_run(out / m) for m in ("decoupled", "elastic-ddp")]
    traces = [r.config["settings"]["failures"] for r in runs]
    assert traces[0] == traces[1] and traces[0]["outages"], "the two runs must see the same failures"
    assert "Under the same failures Decoupled DiLoCo kept" in result.stdout
    assert (out / "report" / "report.html").is_file() and (out / "report" / "loss_vs_time.png").is_file()


def test_loss_at_interpolates_between_eval_points():
    metrics = [
        {"kind": "eval", "t": 10.0, "eval_loss": 4.0},
        {"kind": "train", "t": 15.0, "train_loss": 9.0},
        {"kind": "eval", "t": 20.0, "eval_loss": 3.0},
    ]
    assert loss_at(metrics, 5.0) is None
    assert loss_at(metrics, 15.0) == pytest.approx(3.5)
    assert loss_at(metrics, 99.0) == 3.0


def test_interpretation_states_the_quality_gap_only_when_there_is_one():
    d = {"goodput": 0.66, "sim_seconds": 200.0, "eval_loss": 2.5, "sync_every": 12}
    e = {"goodput": 0.38, "sim_seconds": 500.0, "eval_loss": 2.3, "eval_loss_at_decoupled_end": 2.9}
    text = interpretation(d, e)
    assert "66%" in text and "38%" in text and "2.5x sooner" in text and "2.900" in text and "8.7% above" in text
    assert "above" not in interpretation({**d, "eval_loss": 2.3}, e)
