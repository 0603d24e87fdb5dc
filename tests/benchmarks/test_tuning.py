"""benchmarks/tuning.py on synthetic objectives (bowls in log lr whose minimum is placed by hand), and
time_to_loss.py's use of it with `ddiloco sim` replaced by such a bowl: no training, no timing."""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
import sys  # noqa: E402

sys.path.insert(0, str(ROOT / "benchmarks"))

import time_to_loss as ttl  # noqa: E402
from tuning import DATA_PARALLEL, DILOCO_FAMILY, INNER_LR, OUTER_MOMENTUM, Setting, Tuner  # noqa: E402


def bowl(best: float, name: str = "inner_lr"):  # noqa: ANN201
    """A loss that is lowest at `best`, quadratic in log2 of the setting; counts its calls."""

    def objective(method: str, settings: dict[str, float]) -> float:
        objective.calls += 1  # type: ignore[attr-defined]
        return 2.0 + math.log2(settings[name] / best) ** 2

    objective.calls = 0  # type: ignore[attr-defined]
    return objective


def test_the_grid_widens_until_a_minimum_outside_it_is_strictly_inside():
    # start 3e-3, 6e-3, 1.2e-2; the minimum at 0.05: widened to 2.4e-2, 4.8e-2 (best), 9.6e-2 (worse)
    r = Tuner(bowl(0.05)).tune("ddp", DATA_PARALLEL)
    assert r["grid"]["inner_lr"] == [3e-3, 6e-3, 1.2e-2, 2.4e-2, 4.8e-2, 9.6e-2]
    assert r["chosen"] == {"inner_lr": 4.8e-2} and r["bracketed"] == {"inner_lr": True}
    assert r["grid"]["inner_lr"][0] < r["chosen"]["inner_lr"] < r["grid"]["inner_lr"][-1]
    assert len(r["losses"]) == 6 and r["at_domain_edge"] == {"inner_lr": False}
    # below the grid: widened downwards the same way (1.5e-3 best, 7.5e-4 past it)
    low = Tuner(bowl(1.4e-3)).tune("ddp", DATA_PARALLEL)
    assert low["grid"]["inner_lr"] == [7.5e-4, 1.5e-3, 3e-3, 6e-3, 1.2e-2] and low["chosen"]["inner_lr"] == 1.5e-3


def test_a_minimum_already_inside_is_not_widened():
    f = bowl(6.5e-3)
    r = Tuner(f).tune("ddp", DATA_PARALLEL)
    assert r["grid"]["inner_lr"] == [3e-3, 6e-3, 1.2e-2] and r["chosen"]["inner_lr"] == 6e-3 and f.calls == 3


def test_an_optimum_past_the_widening_bound_is_reported_unbracketed():
    r = Tuner(bowl(10.0), max_widenings=4).tune("ddp", DATA_PARALLEL)
    assert r["grid"]["inner_lr"] == [3e-3, 6e-3, 1.2e-2, 2.4e-2, 4.8e-2, 9.6e-2, 0.192]
    assert r["chosen"]["inner_lr"] == 0.192 and r["bracketed"] == {"inner_lr": False}
    assert r["at_domain_edge"] == {"inner_lr": False}  # the bound stopped it, not the domain


def test_momentum_best_at_its_domain_edge_is_recorded_as_such():
    def rising(method: str, settings: dict[str, float]) -> float:  # lower momentum always better
        return 1.0 + settings["outer_momentum"]

    r = Tuner(rising).tune("diloco", [OUTER_MOMENTUM])
    assert r["grid"]["outer_momentum"] == [0.0, 0.1, 0.3, 0.5, 0.7]  # 0.1 - 0.2 clamped to the domain's 0
    assert r["chosen"]["outer_momentum"] == 0.0 and r["bracketed"]["outer_momentum"] is False
    assert r["at_domain_edge"]["outer_momentum"] is True
    top = Tuner(lambda m, s: 2.0 - s["outer_momentum"]).tune("diloco", [OUTER_MOMENTUM])
    assert top["grid"]["outer_momentum"] == [0.3, 0.5, 0.7, 0.9, 0.95] and top["chosen"]["outer_momentum"] == 0.95
    assert top["at_domain_edge"]["outer_momentum"] is True and top["bracketed"]["outer_momentum"] is False
    inside = Tuner(lambda m, s: abs(s["outer_momentum"] - 0.82)).tune("diloco", [OUTER_MOMENTUM])
    assert inside["chosen"]["outer_momentum"] == 0.9 and inside["bracketed"]["outer_momentum"] is True


def test_settings_are_tuned_one_after_another_each_at_the_choices_before_it():
    def separable(method: str, settings: dict[str, float]) -> float:
        i, o, mu = settings["inner_lr"], settings["outer_lr"], settings["outer_momentum"]
        return math.log2(i / 0.03) ** 2 + math.log2(o / 0.2) ** 2 + (mu - 0.15) ** 2

    r = Tuner(separable).tune("decoupled", DILOCO_FAMILY)
    assert r["chosen"] == {"inner_lr": 0.024, "outer_lr": 0.175, "outer_momentum": 0.1}
    assert all(r["bracketed"].values())
    for e in r["losses"]:  # outer lr tried at the chosen inner lr, momentum at both choices
        s = e["settings"]
        if s["outer_lr"] != 0.7:
            assert s["inner_lr"] == 0.024
        if s["outer_momentum"] != 0.5:
            assert (s["inner_lr"], s["outer_lr"]) == (0.024, 0.175)
    held = Tuner(separable).tune("decoupled", [DILOCO_FAMILY[1]], fixed={"inner_lr": 0.03, "outer_momentum": 0.2})
    assert held["chosen"] == {"inner_lr": 0.03, "outer_lr": 0.175, "outer_momentum": 0.2} and list(held["grid"]) == [
        "outer_lr"
    ]


def test_more_passes_retune_a_setting_whose_best_moved_with_a_later_one():
    def coupled(method: str, settings: dict[str, float]) -> float:  # the best outer lr falls as momentum rises
        o, mu = settings["outer_lr"], settings["outer_momentum"]
        return (math.log2(o / 0.7) + 2 * (mu - 0.5)) ** 2 + 30 * (mu - 0.9) ** 2

    once = Tuner(coupled).tune("decoupled", DILOCO_FAMILY[1:])
    assert once["passes"] == 1 and once["chosen"]["outer_momentum"] > 0.5
    assert once["chosen"]["outer_lr"] == 0.7  # chosen at momentum 0.5, and left there
    again = Tuner(coupled, passes=4).tune("decoupled", DILOCO_FAMILY[1:])
    assert again["passes"] > 1 and all(again["bracketed"].values())
    assert coupled("", again["chosen"]) < coupled("", once["chosen"])
    # a fixed point: each setting, bracketed again at the other's final choice, stays where it is
    for s in DILOCO_FAMILY[1:]:
        alone = Tuner(coupled).tune("decoupled", [s], fixed={k: v for k, v in again["chosen"].items() if k != s.name})
        assert alone["chosen"] == again["chosen"]
    assert Tuner(bowl(0.05), passes=4).tune("ddp", DATA_PARALLEL)["passes"] == 2  # one setting: settled at once


def test_a_second_tuner_on_the_same_file_evaluates_nothing_again(tmp_path: Path):
    path = tmp_path / "tuning.json"
    first = bowl(0.05)
    a = Tuner(first, path, context={"tokens": 10}).tune("ddp", DATA_PARALLEL)
    assert first.calls == 6
    again = bowl(0.05)
    b = Tuner(again, path, context={"tokens": 10}).tune("ddp", DATA_PARALLEL)
    assert again.calls == 0 and b == a
    other = Tuner(bowl(0.05), path, context={"tokens": 10}).tune("diloco", DATA_PARALLEL)
    assert other["chosen"] == a["chosen"]  # another method is another key: evaluated anew
    assert len(json.loads(path.read_text())["evaluations"]) == 12
    with pytest.raises(ValueError, match="another configuration"):
        Tuner(bowl(0.05), path, context={"tokens": 20})


def test_tuners_sharing_a_file_use_each_others_runs_and_lose_none(tmp_path: Path):
    """Two sweeps on one results file (two processes, one per core): both opened before either ran."""
    path = tmp_path / "tuning.json"
    first, second = bowl(0.05), bowl(0.05)
    a, b = Tuner(first, path, context={"tokens": 10}), Tuner(second, path, context={"tokens": 10})
    tuned_a = a.tune("ddp", DATA_PARALLEL)
    assert b.tune("ddp", DATA_PARALLEL) == tuned_a and second.calls == 0  # b read a's runs first
    b.tune("diloco", DATA_PARALLEL)
    a.tune("streaming", DATA_PARALLEL)  # a saves after b did: b's runs stay in the file
    methods = [e["method"] for e in json.loads(path.read_text())["evaluations"]]
    assert methods.count("ddp") == methods.count("diloco") == methods.count("streaming") == 6
    assert first.calls == 12 and second.calls == 6


def test_an_interrupted_tuning_resumes_where_it_stopped(tmp_path: Path):
    path = tmp_path / "tuning.json"

    def dies_after_four(method: str, settings: dict[str, float]) -> float:
        dies_after_four.calls += 1  # type: ignore[attr-defined]
        if dies_after_four.calls > 4:
            raise KeyboardInterrupt
        return 2.0 + math.log2(settings["inner_lr"] / 0.05) ** 2

    dies_after_four.calls = 0  # type: ignore[attr-defined]
    with pytest.raises(KeyboardInterrupt):
        Tuner(dies_after_four, path).tune("ddp", DATA_PARALLEL)
    rest = bowl(0.05)
    r = Tuner(rest, path).tune("ddp", DATA_PARALLEL)
    assert rest.calls == 2 and r["chosen"]["inner_lr"] == 4.8e-2  # 6 in all, 4 saved before the stop


def test_nan_and_inf_are_never_chosen(tmp_path: Path):
    def diverges(method: str, settings: dict[str, float]) -> float:  # the bowl's best points blow up
        lr = settings["inner_lr"]
        return math.nan if lr >= 1.2e-2 else (math.inf if lr == 6e-3 else 3.0 - 100 * lr)

    r = Tuner(diverges, tmp_path / "t.json").tune("ddp", DATA_PARALLEL)
    # 3e-3 (2.7) beats 1.5e-3 (2.85) below it and the diverged 6e-3 above it: bracketed by them
    assert r["grid"]["inner_lr"] == [1.5e-3, 3e-3, 6e-3, 1.2e-2]
    assert r["chosen"]["inner_lr"] == 3e-3 and r["bracketed"]["inner_lr"] is True
    stored = {
        e["settings"]["inner_lr"]: e["loss"] for e in json.loads((tmp_path / "t.json").read_text())["evaluations"]
    }
    assert stored[1.2e-2] is None and stored[6e-3] is None  # JSON has no NaN: stored as null
    # a NaN first on the grid: a plain min() would keep it (nothing compares below NaN)
    low_nan = Tuner(lambda m, s: math.nan if s["inner_lr"] <= 3e-3 else s["inner_lr"] + 1 / s["inner_lr"] / 100)
    first = low_nan.tune("ddp", DATA_PARALLEL)  # lowest at 0.1: widened up to 0.192
    assert first["chosen"]["inner_lr"] == 9.6e-2 and first["bracketed"]["inner_lr"] is True
    every = Tuner(lambda m, s: math.nan).tune("ddp", DATA_PARALLEL)
    assert every["bracketed"]["inner_lr"] is False  # nothing finite: no choice can be trusted


def test_an_explicit_first_grid_is_used_and_widened():
    r = Tuner(bowl(0.04)).tune("ddp", [Setting("inner_lr", 3e-3, start=(3e-3, 6e-3))])
    assert r["grid"]["inner_lr"] == [3e-3, 6e-3, 1.2e-2, 2.4e-2, 4.8e-2, 9.6e-2] and r["chosen"]["inner_lr"] == 4.8e-2
    assert INNER_LR.shift(6e-3, 1) == 1.2e-2 and OUTER_MOMENTUM.shift(0.95, 1) is None


def namespace() -> argparse.Namespace:
    return argparse.Namespace(
        learners=2,
        model_size="tiny",
        data=Path("d.txt"),
        seq_len=16,
        batch_size=4,
        tokens=1000,
        seed=0,
        min_step_seconds=0.1,
        eval_batches=2,
        reconfigure_seconds=1.0,
        inner_optimizer="muon",
        inner_lr=None,
        tuning=None,
        tune_first=[],
    )


def test_time_to_loss_tunes_every_method_and_the_outer_settings_reach_ddiloco_sim(tmp_path, monkeypatch):
    """`ddiloco sim` replaced by a bowl read from its flags: every method's every setting bracketed,
    elastic-ddp at ddp's, the outer flags passed to the DiLoCo family only; a rerun runs nothing."""
    seen: list[list[str]] = []

    def fake_sim(flags: list[str], run_dir: Path) -> dict:
        seen.append(flags)
        value = {
            k: float(flags[flags.index(k) + 1]) for k in ("--inner-lr", "--outer-lr", "--outer-momentum") if k in flags
        }
        loss = math.log2(value["--inner-lr"] / 0.02) ** 2 + math.log2(value.get("--outer-lr", 0.4) / 0.4) ** 2
        return {"summary": {"eval_loss": 2.0 + loss + (value.get("--outer-momentum", 0.65) - 0.65) ** 2}}

    monkeypatch.setattr(ttl, "sim_run", fake_sim)
    tuned, tuning = ttl.tune(namespace(), tmp_path)
    assert set(tuning) == set(ttl.METHODS) and tuning["elastic-ddp"]["takes"] == "ddp"
    for method, entry in tuning.items():
        for name, grid in entry["grid"].items():
            assert grid[0] < entry["chosen"][name] < grid[-1] and entry["bracketed"][name], (method, name)
    assert tuned["elastic-ddp"] == tuned["ddp"] == {"inner_lr": 0.024}
    assert tuned["decoupled"] == {"inner_lr": 0.024, "outer_lr": 0.35, "outer_momentum": 0.7}
    assert not any("--outer-lr" in f for f in seen if f[f.index("--method") + 1] == "ddp")
    assert all("--outer-momentum" in f for f in seen if f[f.index("--method") + 1] in ttl.FAMILY)
    flags = ttl.sim_flags(namespace(), ttl.Scenario("x"), "streaming", tuned["streaming"])
    assert flags[flags.index("--outer-lr") + 1] == "0.35" and flags[flags.index("--outer-momentum") + 1] == "0.7"
    assert all(f[f.index("--inner-optimizer") + 1] == "muon" for f in seen)  # every run, the optimizer given
    assert all(f[f.index("--threads") + 1] == "1" for f in seen)  # a core each: no threads waiting on a busy core
    assert ttl.tuning_context(namespace())["inner_optimizer"] == "muon"  # an AdamW tuning.json is not resumed
    count = len(seen)
    assert ttl.tune(namespace(), tmp_path)[1] == tuning and len(seen) == count  # resumed from tuning.json
    # --tune-first: that method's runs come first (a second process's share), the choices the same
    seen.clear()
    first = argparse.Namespace(**{**vars(namespace()), "tune_first": ["decoupled"]})
    assert ttl.tune(first, tmp_path / "split")[1] == tuning
    assert {f[f.index("--method") + 1] for f in seen[:3]} == {"decoupled"} and len(seen) == count
    chosen, skipped = ttl.untuned(namespace())
    assert all(not e["tuned"] and "--no-sweep" in e["note"] for e in skipped.values())
    assert all(c == {"inner_lr": 1.2e-2} for c in chosen.values())  # the optimizer's default lr
