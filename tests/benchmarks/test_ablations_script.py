"""The ablations benchmark keeps working: its rows are complete and its JSON is the last line (the
figures themselves are reported in docs/results.md, never asserted)."""

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def load_script():
    spec = importlib.util.spec_from_file_location("ablations", ROOT / "benchmarks" / "ablations.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.slow
def test_precision_rows_go_through_every_codec(tmp_path, shakespeare):
    out = subprocess.run(
        [
            sys.executable,
            str(ROOT / "benchmarks" / "ablations.py"),
            "--quick",
            "--only",
            "precision",
            "--json",
            "--data",
            shakespeare,
            "--out",
            str(tmp_path / "a.json"),
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 0, out.stderr[-2000:]
    report = json.loads(out.stdout.strip().splitlines()[-1])
    rows = report["rows"]
    assert [(r["ablation"], r["setting"]) for r in rows] == [("precision", c) for c in ("fp32", "bf16", "int8", "int4")]
    sent = [r["peak_step_bytes"] for r in rows]
    assert sent == sorted(sent, reverse=True) and sent[0] > 6 * sent[-1]  # fp32 > bf16 > int8 > int4
    assert all(r["eval_loss"] > 0 and 0 < r["goodput"] <= 1 for r in rows)
    assert json.loads((tmp_path / "a.json").read_text())["rows"] == rows


def test_bandwidth_needed_is_the_least_link_within_5_percent():
    ablations = load_script()

    def row(method, link, goodput):
        return {"ablation": "distance", "setting": f"{method} {link}", "goodput": goodput}

    rows = [
        row("decoupled", "free link", 0.9),
        row("decoupled", "100 Mbit/s", 0.89),
        row("decoupled", "1 Mbit/s", 0.8),
        row("diloco", "free link", 1.0),
        row("diloco", "10000 Mbit/s", 0.96),
        row("diloco", "1000 Mbit/s", 0.94),
        row("ddp", "free link", 1.0),
        row("ddp", "10000 Mbit/s", 0.9),
    ]
    assert ablations.bandwidth_needed(rows) == {"decoupled": 100.0, "diloco": 10000.0, "ddp": None}


def test_the_sim_benchmarks_take_the_inner_optimizer_they_are_given(shakespeare):
    """quality.py, ablations.py and outer_sweep.py made their committed files with AdamW, before Muon
    became the default: --inner-optimizer adamw reproduces them, each optimizer at its own lr."""
    ablations = load_script()  # puts benchmarks/ on sys.path, where quality and outer_sweep are
    import outer_sweep
    import quality

    from ddiloco.train.inner import DEFAULT_LR, InnerConfig

    spec = ablations.spec(quick=True)
    for optimizer in ("adamw", "muon"):
        rows = ablations.base_rows(spec, 0, shakespeare, optimizer)
        assert rows and {(c.inner.optimizer, c.inner.lr) for c in rows.values()} == {(optimizer, DEFAULT_LR[optimizer])}
        jobs = outer_sweep.jobs(["grid", "ddp-lr"], spec, [0], shakespeare, 24, (1.0, 0.0), optimizer=optimizer)
        assert {c.inner.optimizer for _, c in jobs} == {optimizer}
        ddp = sorted(c.inner.lr for label, c in jobs if label["group"] == "ddp-lr")
        assert ddp == pytest.approx([f * DEFAULT_LR[optimizer] for f in (0.5, 1.0, 2.0)])
    assert ablations.base_rows(spec, 0, shakespeare)["ddp"].inner.optimizer == InnerConfig().optimizer
    assert quality.configs(spec, 0, shakespeare, 24, 10.0)[0][1].inner.optimizer == InnerConfig().optimizer
    assert outer_sweep.default_ddp_lrs("adamw") == pytest.approx((1.5e-3, 3e-3, 6e-3))  # the old fixed grid
