"""benchmarks/gap.py: the gap per seed against data-parallel's same seed, the options measured where
they act, and the best combination only of options that beat the baseline; with a made-up objective
whose answers are known (no training)."""

from __future__ import annotations

import math
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))

import gap  # noqa: E402

CFG = dict(gap.QUICK, seeds=3)


def bowl(x: float, best: float) -> float:
    return (math.log2(x) - math.log2(best)) ** 2 / 100


class Made(gap.Cells):
    """Loss = a bowl in each rate (minimum inside the tuner's first grids' reach) + the method's offset
    + what its options do + a seed's noise; data-parallel is at 2.0 (+ its seed's)."""

    EFFECT = {"outer_debias": -0.05, "outer_restart": -0.10, "outer_lr_per_learner": 0.0, "stale_correction": -0.2}

    def __init__(self, path: Path | None) -> None:
        super().__init__(CFG, None, path)
        self.calls = 0

    def _objective(self, label: str, settings: dict[str, float]) -> float:
        self.calls += 1
        _, method, names = label.split("/")
        seed = settings["seed"] * 0.001
        loss = 2.0 + seed + bowl(settings["inner_lr"], 0.012)
        if "muon" in names:  # Muon's best inner lr is 4x AdamW's, for data-parallel and DiLoCo alike
            loss += bowl(settings["inner_lr"], 0.048) - bowl(settings["inner_lr"], 0.012)
            if method != "ddp":  # and DiLoCo with it wants more outer momentum
                loss += (settings["outer_momentum"] - 0.7) ** 2 - (settings["outer_momentum"] - 0.5) ** 2
        if method == "ddp":
            return loss - (0.1 if "muon" in names else 0.0)
        loss += 0.2 + bowl(settings["outer_lr"], 0.7) + (settings["outer_momentum"] - 0.5) ** 2
        return loss + sum(self.EFFECT.get(n, 0.0) for n in names.split("+") if n)


OPTIONS = {
    name: gap.OPTIONS[name] for name in ("outer_debias", "outer_restart", "outer_lr_per_learner", "stale_correction")
}


def test_the_gap_is_per_seed_against_the_same_seed_of_data_parallel():
    mean, se = gap.gap([2.2, 2.31, 2.42], [2.0, 2.1, 2.2])
    assert mean == pytest.approx(10.0) and se == pytest.approx(0.0, abs=1e-9)
    mean, se = gap.gap([2.2, 2.2], [2.0, 2.2])  # 10 % and 0 %: mean 5, sd 7.07, se 5
    assert mean == pytest.approx(5.0) and se == pytest.approx(5.0)
    assert gap.gap([float("nan"), 2.0], [2.0, 2.0])[0] == math.inf  # a diverged run is no gain


def test_a_cell_tunes_measures_each_option_where_it_acts_and_combines_the_winners(tmp_path):
    made = Made(tmp_path / "runs.json")
    rows = gap.cell(made, "12k", OPTIONS)
    by = {(r["method"], "+".join(r["options"])): r for r in rows}
    # stale-work correction only where work can be late
    assert ("decoupled", "stale_correction") in by and ("diloco", "stale_correction") not in by
    base = by[("diloco", "")]
    assert base["gap_pct"] == pytest.approx(10.0, abs=0.05) and base["seeds"] == 3 and base["bracketed"]
    assert base["chosen"]["inner_lr"] == pytest.approx(0.012) and base["chosen"]["outer_lr"] == pytest.approx(0.7)
    assert by[("diloco", "outer_restart")]["gap_pct"] == pytest.approx(5.0, abs=0.05)
    # the two options that beat the baseline, together (and the one that did not, left out)
    assert by[("diloco", "outer_debias+outer_restart")]["gap_pct"] == pytest.approx(2.5, abs=0.05)
    assert ("diloco", "outer_debias+outer_lr_per_learner+outer_restart") not in by
    assert by[("decoupled", "outer_debias+outer_restart+stale_correction")]["gap_pct"] == pytest.approx(-7.5, abs=0.05)
    # a rerun on the same file trains nothing again
    again = Made(tmp_path / "runs.json")
    assert gap.cell(again, "12k", OPTIONS) == rows and again.calls == 0 and made.calls > 0


def test_an_inner_optimizer_is_measured_against_data_parallel_with_it_too(tmp_path):
    made = Made(None)
    options = {"muon": ({"optimizer": "muon"}, ("diloco-m4", "ddp"))}
    rows = gap.cell(made, "12k", options)
    muon = next(r for r in rows if r["options"] == ["muon"])
    assert muon["ddp_options"] == ["muon"] and muon["ddp_loss_mean"] == pytest.approx(1.901)  # 2.0 - 0.1 + seeds
    # DiLoCo with Muon gets its own inner lr, as data-parallel with Muon does, not AdamW's 0.012
    assert muon["chosen"]["inner_lr"] == pytest.approx(0.048) and muon["bracketed"]
    assert muon["chosen"]["outer_momentum"] == pytest.approx(0.7)  # tuned again, as its baseline was
    assert next(r for r in rows if r["options"] == [])["chosen"]["inner_lr"] == pytest.approx(0.012)


def test_options_the_package_lacks_are_named_and_left_out():
    have, missing = gap.available({**OPTIONS, "nonsense": ({"no_such_field": 1}, gap.METHODS)})
    assert set(have) == set(OPTIONS) and missing == ["nonsense"]


def test_a_larger_size_measures_only_the_options_that_won_and_starts_its_grids_at_the_last_choice(tmp_path):
    made = Made(None)
    rows, not_carried = gap.carried_rows(made, ["12k", "25k"], OPTIONS, every_option=False)
    at = {(r["size"], r["method"], "+".join(r["options"])) for r in rows}
    # outer_lr_per_learner bought nothing at 12k: measured there, not at 25k, and the report says so
    assert ("12k", "diloco", "outer_lr_per_learner") in at and ("25k", "diloco", "outer_lr_per_learner") not in at
    assert ("25k", "diloco", "outer_restart") in at and ("25k", "decoupled", "stale_correction") in at
    assert not_carried == {"25k": {"diloco-m4": ["outer_lr_per_learner"], "decoupled-m4": ["outer_lr_per_learner"]}}
    # 12k's inner-lr grid starts around the default 0.006 and widens to reach 0.012; 25k's starts at 0.012
    inner = {
        size: {e["settings"]["inner_lr"] for e in made.tuner.memo.values() if e["method"] == f"{size}/diloco-m4/"}
        for size in ("12k", "25k")
    }
    assert 0.003 in inner["12k"] and inner["25k"] == {0.006, 0.012, 0.024}
    assert all(r["chosen"]["inner_lr"] == pytest.approx(0.012) for r in rows if not r["options"])
    # every option at every size, when asked
    every, none_left = gap.carried_rows(Made(None), ["12k", "25k"], OPTIONS, every_option=True)
    assert none_left == {} and ("25k", "diloco", "outer_lr_per_learner") in {
        (r["size"], r["method"], "+".join(r["options"])) for r in every
    }


def test_a_sweep_split_by_method_over_one_runs_file_adds_up_to_the_whole(tmp_path):
    path = tmp_path / "runs.json"
    one, other = Made(path), Made(path)  # two processes, a core each, on one runs file
    part = gap.carried_rows(one, ["12k"], OPTIONS, False, ("diloco-m4",))[0]
    rest = gap.carried_rows(other, ["12k"], OPTIONS, False, ("decoupled-m4",))[0]
    assert {r["method"] for r in part} == {"diloco"} and {r["method"] for r in rest} == {"decoupled"}
    whole = Made(path)
    assert gap.carried_rows(whole, ["12k"], OPTIONS, False)[0] == part + rest and whole.calls == 0


def test_an_unknown_option_is_a_one_line_error_before_anything_runs(tmp_path, capsys):
    with pytest.raises(SystemExit) as exit_info:
        gap.main(["--quick", "--options", "muon", "bogus", "--out", str(tmp_path / "gap.json")])
    assert exit_info.value.code == 2 and "--options: unknown bogus" in capsys.readouterr().err
    assert not (tmp_path / "gap.runs.json").exists()


def test_the_global_batch_is_split_over_the_learners_and_keys_the_runs_file():
    config = gap.sim_config(dict(CFG, global_batch=64), "12k", "decoupled-m4", {"inner_lr": 0.01}, {})
    assert config.inner.batch_size == 16 and config.learners == 4
    assert gap.sim_config(dict(CFG, global_batch=64), "12k", "ddp", {"inner_lr": 0.01}, {}).inner.batch_size == 16
    small, large = (gap.Cells(dict(CFG, global_batch=g), None, None) for g in (8, 64))
    assert small.tuner.context != large.tuner.context  # runs of one batch are never read as another's


def test_the_config_names_the_layout_its_task_deals():
    """`run_sim` is handed a task of the cell's layout; the config it runs with says the same."""
    for layout in ("interleaved", "contiguous"):
        config = gap.sim_config(dict(CFG, shard_layout=layout), "12k", "decoupled-m4", {"inner_lr": 0.01}, {})
        assert config.shard_layout == layout
    assert gap.sim_config(dict(CFG), "12k", "ddp", {"inner_lr": 0.01}, {}).shard_layout == "interleaved"
