"""The quality benchmark script keeps working (its numbers are reported, never asserted)."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def test_quick_vision_rows_are_complete(tmp_path, shakespeare):
    out = subprocess.run(
        [
            sys.executable,
            str(ROOT / "benchmarks" / "quality.py"),
            "--quick",
            "--models",
            "vision",
            "--json",
            "--data",
            shakespeare,
            "--out",
            str(tmp_path / "q.json"),
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 0, out.stderr[-2000:]
    report = json.loads(out.stdout.strip().splitlines()[-1])
    names = [r["name"] for r in report["rows"]]
    assert names == [
        "ddp",
        "ddp-failures",
        "elastic-ddp-failures",
        "diloco",
        "decoupled",
        "decoupled-failures",
        "decoupled-paper",
        "decoupled-paper-failures",
        "decoupled-hetero-km",
        "decoupled-hetero-k1",
        "decoupled-hetero-k1-grace",
        "decoupled-paper-hetero-k1",
    ]
    for row in report["rows"]:
        assert row["model"] == "vision" and 0 <= row["eval_accuracy"] <= 1 and 0 < row["goodput"] <= 1
    assert json.loads((tmp_path / "q.json").read_text())["rows"] == report["rows"]
    assert {v["aim"] for v in report["verdicts"]}  # the aims are judged and reported


@pytest.mark.slow
def test_outer_sweep_runs_its_groups_and_summarizes_split_runs(tmp_path, shakespeare):
    def sweep(*args: str) -> dict:
        out = subprocess.run(
            [
                sys.executable,
                str(ROOT / "benchmarks" / "outer_sweep.py"),
                "--quick",
                "--models",
                "vision",
                "--seeds",
                "0",
                "--json",
                "--data",
                shakespeare,
                *args,
            ],
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert out.returncode == 0, out.stderr[-2000:]
        return json.loads(out.stdout.strip().splitlines()[-1])

    a = sweep(
        "--groups",
        "grid",
        "--lrs",
        "1.0",
        "--momenta",
        "0",
        "0.9",
        "--methods",
        "diloco",
        "--out",
        str(tmp_path / "a.json"),
    )
    assert a["best"]["vision"]["diloco"] in ([1.0, 0.0], [1.0, 0.9])
    sweep("--groups", "ddp-lr", "one-learner", "--out", str(tmp_path / "b.json"))
    both = sweep("--load", str(tmp_path / "a.json"), str(tmp_path / "b.json"))
    groups = {(s["group"], s["method"]) for s in both["summary"]}
    assert groups == {("grid", "diloco"), ("ddp-lr", "ddp"), ("one-learner", "ddp"), ("one-learner", "diloco")}
    # every row is compared with the best data-parallel inner lr of the same model
    assert min(s["vs_tuned_ddp"] for s in both["summary"] if s["group"] == "ddp-lr") == 1.0


def test_scale_sweep_compares_each_method_with_data_parallel_at_the_same_size_and_budget(tmp_path, shakespeare):
    def sweep(*args: str) -> dict:
        out = subprocess.run(
            [sys.executable, str(ROOT / "benchmarks" / "scale_sweep.py"), "--json", "--data", shakespeare, *args],
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert out.returncode == 0, out.stderr[-2000:]
        return json.loads(out.stdout.strip().splitlines()[-1])

    a = sweep("--quick", "--budgets", "0.25", "--methods", "ddp", "decoupled", "--out", str(tmp_path / "a.json"))
    cells = {(s["budget"], s["method"]): s for s in a["summary"]}
    assert set(cells) == {(0.25, "ddp"), (0.25, "decoupled")} and cells[(0.25, "ddp")]["vs_ddp"] == 1.0
    assert cells[(0.25, "ddp")]["tokens"] == 30_000 and cells[(0.25, "ddp")]["params"] > 0
    assert (
        cells[(0.25, "decoupled")]["vs_ddp"]
        == cells[(0.25, "decoupled")]["eval_loss"] / cells[(0.25, "ddp")]["eval_loss"]
    )
    again = sweep("--load", str(tmp_path / "a.json"))
    assert again["summary"] == a["summary"]
    out = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "scale_sweep.py"), "--sizes", "huge"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode != 0 and "huge" in out.stderr  # refused before any run
