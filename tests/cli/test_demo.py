"""`ddiloco demo`: four methods on one failure trace and one link, side by side, with the report written."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from ddiloco.cli import _register, app
from ddiloco.cli.demo import METHODS, interpretation, loss_at, scaled_link
from ddiloco.records.rundir import load_run

_register()


def test_demo_compares_four_methods_on_the_same_failures_and_link(shakespeare, tmp_path):
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
    every = json.loads(result.stdout.strip().splitlines()[-1])
    assert set(METHODS) == {"decoupled", "diloco", "ddp", "elastic-ddp"} and set(METHODS) <= set(every)
    for m in METHODS:
        assert every[m]["method"] == m and every[m]["tokens"] >= 12000
    runs = [load_run(out / m) for m in METHODS]
    settings = [r.config["settings"] for r in runs]
    assert all(s["failures"] == settings[0]["failures"] for s in settings) and settings[0]["failures"]["outages"]
    assert all(s["link"] == settings[0]["link"] for s in settings), "the runs must share the link"
    first = min(every[m]["sim_seconds"] for m in METHODS)
    assert all(every[m]["eval_loss_at_first_finish"] is not None for m in METHODS if every[m]["sim_seconds"] == first)
    assert "At equal wall time" in result.stdout and "at equal tokens" in result.stdout
    assert (out / "report" / "report.html").is_file() and (out / "report" / "loss_vs_time.png").is_file()


def test_the_link_makes_one_all_reduce_take_a_step_by_hand():
    link = scaled_link(1_000_000, latency=0.05)
    assert link.transfer(2 * 1_000_000 * 2.0) == pytest.approx(0.05 + 1.0)  # 2 x params x bf16 in one step


def test_loss_at_interpolates_between_eval_points():
    metrics = [
        {"kind": "eval", "t": 10.0, "eval_loss": 4.0},
        {"kind": "train", "t": 15.0, "train_loss": 9.0},
        {"kind": "eval", "t": 20.0, "eval_loss": 3.0},
    ]
    assert loss_at(metrics, 5.0) is None
    assert loss_at(metrics, 15.0) == pytest.approx(3.5)
    assert loss_at(metrics, 99.0) == 3.0


def test_interpretation_names_the_winner_at_equal_time_and_at_equal_tokens_from_the_numbers():
    results = {
        "decoupled": {"sim_seconds": 200.0, "eval_loss": 2.5, "eval_loss_at_first_finish": 2.5},
        "diloco": {"sim_seconds": 260.0, "eval_loss": 2.45, "eval_loss_at_first_finish": 2.7},
        "ddp": {"sim_seconds": 500.0, "eval_loss": 2.3, "eval_loss_at_first_finish": 2.9},
        "elastic-ddp": {"sim_seconds": 450.0, "eval_loss": 2.31, "eval_loss_at_first_finish": None},
    }
    text = interpretation(results)
    assert text.startswith("At equal wall time (200 simulated s, when Decoupled DiLoCo finished) Decoupled DiLoCo")
    assert "at equal tokens DDP is lowest (2.300;" in text and "elastic DDP not yet evaluated" in text
    results["diloco"]["eval_loss_at_first_finish"] = 2.4
    assert "Decoupled DiLoCo finished) DiLoCo is lowest in eval loss (2.400;" in interpretation(results)
