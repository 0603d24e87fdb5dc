"""benchmarks/time_to_loss.py: its pure parts against hand-computed values (seconds to a target on a
hand-made curve, the loss at a given second, the target and the aims, the cross-site link scaling),
and, marked slow, its smallest real path. No timing is asserted."""

from __future__ import annotations

import argparse
import json
import math
import shutil
import subprocess
import sys
from functools import partial
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))

import time_to_loss as ttl  # noqa: E402
from time_to_loss_curves import eval_batches, loss_at, read_curve, seconds_to_target, window  # noqa: E402

CURVE = [(2.0, 3.0), (4.0, 2.6), (6.0, 2.2), (10.0, 2.0)]


def test_seconds_to_target_is_the_first_crossing_linear_between_evaluations():
    assert seconds_to_target(CURVE, 2.4) == pytest.approx(5.0)  # halfway from 2.6 (4 s) to 2.2 (6 s)
    assert seconds_to_target(CURVE, 2.1) == pytest.approx(8.0)  # 2.2 -> 2.0 over 6..10 s
    assert seconds_to_target(CURVE, 2.0) == pytest.approx(10.0)  # reached at the last point only
    assert seconds_to_target(CURVE, 3.5) == 2.0  # already below at the first evaluation
    assert seconds_to_target(CURVE, 1.9) is None  # never
    assert seconds_to_target([], 2.0) is None
    # a later dip does not count twice: the first crossing is what it says
    assert seconds_to_target([(1.0, 3.0), (2.0, 2.0), (3.0, 2.5), (4.0, 1.9)], 2.1) == pytest.approx(1.9)


def test_loss_at_a_second():
    assert loss_at(CURVE, 5.0) == pytest.approx(2.4)
    assert loss_at(CURVE, 8.0) == pytest.approx(2.1)
    assert loss_at(CURVE, 4.0) == pytest.approx(2.6)
    assert loss_at(CURVE, 30.0) == 2.0  # the run was over: its final model's loss
    assert loss_at(CURVE, 1.0) is None  # before its first evaluation: unknown


def test_compare_takes_the_best_baselines_final_loss_as_the_target():
    runs = {
        "ddp": {"curve": [(5.0, 3.0), (20.0, 2.3)], "finish": 20.0},
        "elastic-ddp": {"curve": [(5.0, 3.0), (15.0, 2.5)], "finish": 15.0},
        "diloco": {"curve": [(5.0, 3.0), (30.0, 2.4)], "finish": 30.0},
        "decoupled": {"curve": [(5.0, 2.9), (10.0, 2.5), (12.0, 2.2)], "finish": 12.0},
    }
    c = ttl.compare(runs)
    assert c["best_baseline"] == "ddp" and c["target"] == 2.3 and c["first_finish_seconds"] == 12.0
    assert c["best_synchronous"] == "diloco"  # the only synchronous DiLoCo here
    streaming = {"curve": [(5.0, 3.0), (25.0, 2.35)], "finish": 25.0}
    assert ttl.compare({**runs, "streaming": streaming})["best_synchronous"] == "streaming"  # 2.35 < 2.4
    assert c["seconds"]["ddp"] == pytest.approx(20.0)
    assert c["seconds"]["decoupled"] == pytest.approx(10.0 + 2.0 * (0.2 / 0.3))
    assert c["seconds"]["elastic-ddp"] is None and c["seconds"]["diloco"] is None
    assert c["at_first"]["decoupled"] == 2.2
    assert c["at_first"]["ddp"] == pytest.approx(3.0 - 0.7 * 7 / 15)
    tolerant = ttl.compare(runs, tolerance=0.05)  # within 0.05 of 2.3: 2.35, halfway from 2.5 to 2.2
    assert tolerant["target"] == 2.3 and tolerant["seconds"]["decoupled"] == pytest.approx(11.0)
    assert tolerant["strict"]["decoupled"] == pytest.approx(c["seconds"]["decoupled"])
    assert ttl.aim_met("cross_site", c["seconds"], c["best_baseline"]) is False  # 11.33 > 20 / 2
    assert ttl.aim_met("one_site", c["seconds"], c["best_baseline"]) is True  # elastic never got there
    assert ttl.aim_met("mixed_hardware", {"decoupled": 9.0, "ddp": 20.0}, "ddp") is True
    assert ttl.aim_met("preemptible", {"decoupled": None, "elastic-ddp": None}, "ddp") is False


def test_cross_site_link_keeps_the_bytes_to_compute_ratio_of_a_1b_model_on_1_gbit():
    latency, mbps, scaling = ttl.cross_site_link(params=1_000_000, step_seconds=0.1)
    # 1 Gbit/s = 125 MB/s for 1e9 parameters and 1 s steps; 1e6 parameters at 0.1 s steps: 125 * 1e-3 * 10
    assert mbps == pytest.approx(1.25) and latency == pytest.approx(3.5)
    assert scaling["bandwidth_scale"] == pytest.approx(0.01)
    seconds_per_byte_real, seconds_per_byte_here = 1.0 / 125e6, 0.1 / (mbps * 1e6)
    assert seconds_per_byte_here / 1e6 == pytest.approx(seconds_per_byte_real / 1e9)  # per parameter, per step


def test_read_curve_counts_from_the_window_and_puts_the_final_evaluation_at_its_end(tmp_path: Path):
    lines = [
        {"kind": "eval", "t": 1.0, "tokens": 0, "eval_loss": 5.5},  # before training began: start-up
        {"kind": "eval", "t": 3.0, "tokens": 1, "eval_loss": 3.1},
        {"kind": "train", "t": 3.5, "tokens": 1, "train_loss": 9.0},
        {"kind": "eval", "t": 6.0, "tokens": 2, "eval_loss": 2.8},
        {"kind": "eval", "t": 11.0, "tokens": 3, "eval_loss": 2.7},  # after the budget, before the final one
        {"kind": "eval", "t": 14.0, "tokens": 3, "eval_loss": 2.65},  # the final model, written at exit
    ]
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(e) + "\n" for e in lines))
    (tmp_path / "config.json").write_text(json.dumps({"clock_origin": 100.0}))
    span = window(tmp_path, {"window_start": 101.5, "run_seconds": 8.5})
    assert span == pytest.approx((1.5, 10.0))
    assert read_curve(tmp_path, span) == [(1.5, 3.1), (4.5, 2.8), (8.5, 2.65)]
    assert read_curve(tmp_path) == [(1.0, 5.5), (3.0, 3.1), (6.0, 2.8), (11.0, 2.7), (14.0, 2.65)]


@pytest.mark.slow
def test_the_smallest_real_path_prints_every_field(shakespeare: str, tmp_path: Path):
    out = subprocess.run(
        [
            sys.executable,
            str(ROOT / "benchmarks" / "time_to_loss.py"),
            "--quick",
            "--scenarios",
            "mixed_hardware",
            "--tokens",
            "60000",
            "--learners",
            "2",
            "--no-sweep",
            "--no-sim",
            "--reruns",
            "0",  # a test shares the machine: its runs are kept (and flagged), not redone
            "--data",
            shakespeare,
            "--run-dir",
            str(tmp_path),
            "--json",
        ],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    report = json.loads(out.stdout.strip().splitlines()[-1])
    scenario = report["scenarios"]["mixed_hardware"]
    rows = scenario["per_seed"]["0"]["rows"]  # the one seed's own figures
    assert [r["method"] for r in rows] == list(ttl.METHODS)
    for r in rows:
        assert {"method", "seconds_to_target", "loss_at_first_finish", "goodput", "eval_loss"} <= set(r)
        # (not <= 1: the runtime's goodput of a run this short can read a little above 1, e.g. 1.011)
        assert 0 < r["goodput"] < 1.1 and r["eval_loss"] < 5.6  # the initial model's loss is 5.53
        assert r["eval_batches"] == report["settings"]["eval_batches"] == 8  # curve and target alike
        assert 0 <= r["others_cpu_share"] <= 1 and r["attempts"] == 1
    for r in scenario["rows"]:  # over the seeds: a run beside other work (a loaded test machine) is left out
        assert r["seeds"] + r["left_out"] == [0] and r["eval_batches"] == 8
        kept = {m["method"]: m for m in rows}[r["method"]]["quiet"]
        assert (r["eval_loss"] is None) == (kept is False)
    assert (tmp_path / "seed-0" / "time-to-loss-mixed_hardware.png").is_file()
    assert set(report["scenarios"]["mixed_hardware"]["per_seed"]) == {"0"}


def test_a_rows_eval_batches_is_one_count_for_curve_and_target_or_an_error(tmp_path):
    def metrics(*counts: int | None) -> Path:
        lines = [{"kind": "train", "t": 0.5, "tokens": 1, "train_loss": 3.0}]
        lines += [
            {"kind": "eval", "t": float(i), "tokens": i, "eval_loss": 2.0, "eval_batches": c}
            for i, c in enumerate(counts)
        ]
        d = tmp_path / str(len(list(tmp_path.iterdir())))
        d.mkdir()
        (d / "metrics.jsonl").write_text(
            "\n".join(json.dumps({k: v for k, v in e.items() if v is not None}) for e in lines)
        )
        return d

    assert eval_batches(metrics(8, 8, 8)) == 8
    assert eval_batches(metrics(None, None)) is None  # a run from before the count was recorded
    with pytest.raises(ValueError, match="different validation batches"):
        eval_batches(metrics(4, 4, 8))  # the curve on 4, the target on 8: the defect this guards
    with pytest.raises(ValueError, match="different validation batches"):
        eval_batches(metrics(None, 8))


def _seed(target: float, aim: bool, rows: dict[str, dict]) -> dict:
    out = []
    for m, r in rows.items():
        out.append({"method": m, "eval_batches": 8, "goodput": 0.9, "inner_lr": 0.01, "quiet": True, **r})
    return {"rows": out, "target": target, "aim_met": aim}


def test_across_seeds_gives_mean_and_sd_per_method_and_leaves_out_a_run_made_beside_other_work():
    from time_to_loss_seeds import across_seeds

    per_seed = {
        0: _seed(
            2.0,
            True,
            {
                "ddp": {"seconds_to_target": 100.0, "eval_loss": 2.0},
                "elastic-ddp": {"seconds_to_target": 120.0, "eval_loss": 2.1},
                "decoupled": {"seconds_to_target": 60.0, "eval_loss": 2.05},
            },
        ),
        1: _seed(
            2.2,
            False,
            {
                "ddp": {"seconds_to_target": 110.0, "eval_loss": 2.2},
                "elastic-ddp": {"seconds_to_target": None, "eval_loss": 2.4},  # never reached in this seed
                "decoupled": {"seconds_to_target": 90.0, "eval_loss": 2.25},
            },
        ),
        2: _seed(
            2.1,
            True,
            {
                "ddp": {"seconds_to_target": 105.0, "eval_loss": 2.1},
                "elastic-ddp": {"seconds_to_target": 130.0, "eval_loss": 2.2},
                "decoupled": {"seconds_to_target": 500.0, "eval_loss": 2.15, "quiet": False},  # beside other work
            },
        ),
    }
    s = across_seeds(
        per_seed, ("ddp", "elastic-ddp", "decoupled"), ("ddp", "elastic-ddp"), partial(ttl.aim_met, "one_site")
    )
    rows = {r["method"]: r for r in s["rows"]}
    assert rows["ddp"]["seconds_to_target"] == pytest.approx(105.0) and rows["ddp"][
        "seconds_to_target_sd"
    ] == pytest.approx(5.0)
    assert rows["ddp"]["eval_loss"] == pytest.approx(2.1) and rows["ddp"]["eval_loss_sd"] == pytest.approx(0.1)
    assert rows["decoupled"]["left_out"] == [2] and rows["decoupled"]["seeds"] == [0, 1]
    assert rows["decoupled"]["seconds_to_target"] == pytest.approx(75.0)  # 60 and 90; seed 2's 500 left out
    assert rows["decoupled"]["seconds_to_target_sd"] == pytest.approx(21.2132, abs=1e-3)
    assert rows["elastic-ddp"]["reached"] == 2 and rows["elastic-ddp"]["seconds_to_target"] is None  # never in seed 1
    assert rows["elastic-ddp"]["seconds_to_target_per_seed"] == {"0": 120.0, "1": None, "2": 130.0}
    assert s["best_baseline"] == "ddp" and s["target"] == pytest.approx(2.1)
    assert s["aim_met"] is True  # 75 s against elastic-ddp's "never in some seed"
    assert s["aim_met_per_seed"] == {"0": True, "1": False, "2": True}
    one = {0: per_seed[0]}
    assert (
        across_seeds(one, ("ddp",), ("ddp",), partial(ttl.aim_met, "one_site"))["rows"][0]["seconds_to_target_sd"]
        is None
    )
    per_seed[1]["rows"][0]["eval_batches"] = 4
    with pytest.raises(ValueError, match="different validation batches"):
        across_seeds(per_seed, ("ddp",), ("ddp",), partial(ttl.aim_met, "one_site"))


def test_a_scenarios_seed_is_read_back_when_run_again_with_the_same_settings(tmp_path, monkeypatch):
    calls = []

    def fake(args, sc, tuned, base):
        calls.append(args.seed)
        return {"rows": [], "target": 1.0 + args.seed}

    monkeypatch.setattr(ttl, "one_scenario", fake)
    args = argparse.Namespace(
        model_size="tiny",
        data=Path("d.txt"),
        tokens=1000,
        learners=2,
        seq_len=8,
        batch_size=2,
        inner_optimizer="muon",
        seed=1,
        min_step_seconds=0.1,
        eval_batches=8,
        reconfigure_seconds=1.0,
        cap=3.0,
        eval_every=2.0,
        tolerance=0.01,
        no_sim=True,
        failure_speedup=6.0,
        preemptible_backend=None,
    )
    tuned = {"ddp": {"inner_lr": 0.01}}
    sc = ttl.Scenario("one_site")
    assert ttl.scenario_once(args, sc, tuned, tmp_path)["target"] == 2.0
    assert ttl.scenario_once(args, sc, tuned, tmp_path)["target"] == 2.0 and calls == [1]  # read back
    assert ttl.scenario_once(args, sc, {"ddp": {"inner_lr": 0.02}}, tmp_path) and calls == [1, 1]  # other settings: run


def test_a_virtual_clock_run_is_read_back_only_for_the_same_flags_and_trace(tmp_path, monkeypatch):
    """`--sims-only` makes them beside other work; the real runs read them back (`cached_sim`)."""
    calls = []

    def fake_sim(flags: list[str], run_dir: Path) -> dict:
        calls.append(list(flags))
        run_dir.mkdir(parents=True)
        (run_dir / "metrics.jsonl").write_text("{}\n")
        return {"summary": {"eval_loss": 2.0 + len(calls)}, "curve": [(1.0, 3.0)], "finish": math.nan}

    monkeypatch.setattr(ttl, "sim_run", fake_sim)
    trace = tmp_path / "trace.csv"
    trace.write_text("learner,down_at,up_at\n1,4.0,6.0\n")
    flags, run_dir = ["--method", "ddp", "--chaos-trace", str(trace)], tmp_path / "sim-ddp"
    first = ttl.cached_sim(flags, run_dir)
    assert first["summary"]["eval_loss"] == 3.0 and first["curve"] == [[1.0, 3.0]] and math.isnan(first["finish"])
    assert ttl.cached_sim(flags, run_dir)["summary"]["eval_loss"] == 3.0 and len(calls) == 1  # read back
    assert ttl.cached_sim([*flags, "--seed", "1"], run_dir)["summary"]["eval_loss"] == 4.0  # other flags: run again
    trace.write_text("learner,down_at,up_at\n1,5.0,6.0\n")
    assert ttl.cached_sim([*flags, "--seed", "1"], run_dir)["summary"]["eval_loss"] == 5.0  # another trace: again
    assert len(calls) == 3
    # --sims DIR keeps the results apart from the run directory, which may then be lost
    args = argparse.Namespace(sims=tmp_path / "kept")
    run_dir = tmp_path / "run" / "seed-1" / "one_site" / "sim-ddp"
    kept = ttl.sim_kept(args, run_dir)
    assert kept == tmp_path / "kept" / "seed-1" / "one_site" / "sim-ddp.json"
    assert ttl.cached_sim(flags, run_dir, kept)["summary"]["eval_loss"] == 6.0 and kept.is_file()
    shutil.rmtree(tmp_path / "run")
    assert ttl.cached_sim(flags, run_dir, kept)["summary"]["eval_loss"] == 6.0 and len(calls) == 4
    assert ttl.sim_kept(argparse.Namespace(sims=None), run_dir) == run_dir / "sim-result.json"


def fake_real_runs(monkeypatch) -> tuple[list[Path], argparse.Namespace]:  # noqa: ANN001
    """`one_real_run` replaced by a stand-in (its Nth call ends at eval loss 2 + N; a run directory
    holding a cut-short run's checkpoints fails it), and the args a small run takes: (calls, args)."""
    calls: list[Path] = []

    def fake_run(args, sc, flags, run_dir, what):
        assert not (run_dir / "sync-0").exists(), "a cut-short run's checkpoints were left in place"
        calls.append(run_dir)
        run_dir.mkdir(parents=True)
        return {"eval_loss": 2.0 + len(calls), "load": {"quiet": True, "others_cpu_share": 0.01}}

    monkeypatch.setattr(ttl, "one_real_run", fake_run)
    monkeypatch.setattr(ttl, "window", lambda run_dir, summary: (1.0, 5.0))
    monkeypatch.setattr(ttl, "read_curve", lambda run_dir, span: [(1.0, 3.0)])
    monkeypatch.setattr(ttl, "eval_batches", lambda run_dir: 8)
    args = argparse.Namespace(
        learners=2, model_size="tiny", data=Path("d.txt"), seq_len=8, batch_size=2, inner_optimizer="muon",
        tokens=1000, cap_seconds=30.0, seed=0, min_step_seconds=0.1, eval_every=2.0, eval_batches=8,
        allreduce_precision="bf16", reruns=1, reals=None,
    )  # fmt: skip
    return calls, args


def test_a_real_run_is_read_back_once_it_ended_and_made_afresh_after_a_cut(tmp_path, monkeypatch):
    """A full-size pass spans sessions: a real run that ended is not made again; one cut short left its
    checkpoints, from which the synchronizers would resume, so its folder goes before it is made."""
    calls, args = fake_real_runs(monkeypatch)
    trace = tmp_path / "trace.csv"
    trace.write_text("learner,down_at,up_at\n1,4.0,6.0\n")
    sc, run_dir = ttl.Scenario("one_site", trace=trace), tmp_path / "seed-0" / "one_site" / "decoupled"
    (run_dir / "sync-0").mkdir(parents=True)  # a run cut short: no real-result.json
    first = ttl.run_real(args, sc, "decoupled", {"inner_lr": 0.01}, run_dir)
    assert first["summary"]["eval_loss"] == 3.0 and first["curve"] == [[1.0, 3.0]] and first["finish"] == 4.0
    assert ttl.run_real(args, sc, "decoupled", {"inner_lr": 0.01}, run_dir) == first and len(calls) == 1
    (run_dir / "sync-0").mkdir()  # as a run leaves it; made again below, it must go first
    trace.write_text("learner,down_at,up_at\n1,5.0,6.0\n")  # another failure trace: made again
    assert ttl.run_real(args, sc, "decoupled", {"inner_lr": 0.01}, run_dir)["summary"]["eval_loss"] == 4.0
    assert ttl.run_real(args, sc, "decoupled", {"inner_lr": 0.02}, run_dir)["summary"]["eval_loss"] == 5.0
    assert len(calls) == 3


def test_a_real_run_kept_in_reals_is_read_back_when_its_run_directory_is_gone(tmp_path, monkeypatch):
    """--reals DIR keeps each real run's result beside the committed virtual-clock runs: a full-size
    pass spans sessions, and a fresh machine (no run directory) must not make its runs again."""
    calls, args = fake_real_runs(monkeypatch)
    sc = ttl.Scenario("one_site")
    run_dir = tmp_path / "runs" / "seed-1" / "one_site" / "decoupled"
    first = ttl.run_real(args, sc, "decoupled", {"inner_lr": 0.01}, run_dir)  # made without --reals
    args.reals = tmp_path / "reals"
    kept = args.reals / "seed-1" / "one_site" / "decoupled.json"
    assert ttl.run_real(args, sc, "decoupled", {"inner_lr": 0.01}, run_dir) == first and len(calls) == 1
    assert kept.is_file()  # a run made before the flag is copied there when read back
    shutil.rmtree(tmp_path / "runs")  # a fresh machine
    assert ttl.run_real(args, sc, "decoupled", {"inner_lr": 0.01}, run_dir) == first and len(calls) == 1
    # keyed by its flags: a run of other settings is made, and kept in the same place
    second = ttl.run_real(args, sc, "decoupled", {"inner_lr": 0.02}, run_dir)
    assert second["summary"]["eval_loss"] == 4.0 and len(calls) == 2
    assert json.loads(kept.read_text())["result"] == second


def test_the_tuning_seed_is_the_first_runs_unless_given():
    """A second process for seeds 1 and 2 reads the tuning made at seed 0 (its file is keyed by seed)."""
    assert ttl.seeds(None, None) == ([0], 0)
    assert ttl.seeds(None, 3) == ([3], 3)
    assert ttl.seeds([1, 2], None) == ([1, 2], 1)
    assert ttl.seeds([1, 2], 0) == ([1, 2], 0)
