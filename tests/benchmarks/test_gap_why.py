"""benchmarks/gap_why.py: a round of M learners against data-parallel's steps on the same rows. M = 1 is
data-parallel itself (the check the figures rest on), M > 1 learners see disjoint rows of the same
batches, the outer step's scale is bracketed, and the summary's efficiency is a ratio of summed gains.
A real tiny GPT on the shared corpus; no timing."""

from __future__ import annotations

import math
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))

import gap_why  # noqa: E402

from ddiloco.train.streams import Batch  # noqa: E402


def test_a_learners_rows_are_its_share_of_the_batch_and_the_shares_cover_it():
    batch = Batch(torch.arange(8 * 3).view(8, 3), torch.arange(8 * 3).view(8, 3) + 1, tokens=24)
    parts = [gap_why.rows(batch, m, 4) for m in range(4)]
    assert all(p.inputs.shape == (2, 3) and p.tokens == 6 for p in parts)
    assert torch.equal(torch.cat([p.inputs for p in parts]), batch.inputs)  # disjoint, in order, all of it
    assert torch.equal(parts[2].targets, batch.targets[4:6])


def test_the_outer_step_scale_is_widened_until_the_best_is_inside():
    def bowl(best: float):
        return lambda eta: (math.log(eta) - math.log(best)) ** 2

    eta, loss = gap_why.best_outer_lr(bowl(1.0))
    assert eta == 1.0 and loss == 0.0
    eta, _ = gap_why.best_outer_lr(bowl(4.0))  # past the grid's top (2.0): 2.8, 3.92, 5.488 tried
    assert eta == pytest.approx(3.92)
    eta, _ = gap_why.best_outer_lr(bowl(0.2))  # below its bottom (0.5): 0.357, 0.255, 0.182, 0.130
    assert eta == pytest.approx(0.1822, abs=1e-4)


def test_summary_efficiency_is_summed_round_gains_over_summed_data_parallel_gains():
    cells = [
        {"size": "25k", "H": 4, "M": 2, "cos": c, "norm_ratio": 0.9, "learner_cos": 0.5, "outer_lr": 1.0,
         "dp_outer_lr": 1.0, "gain_round": g, "gain_dp": d}
        for c, g, d in ((0.8, 0.03, 0.04), (0.6, -0.001, 0.002), (0.7, 0.01, 0.014))
    ]  # fmt: skip
    (row,) = gap_why.summarize(cells)
    assert row["efficiency"] == pytest.approx(0.039 / 0.056)  # not the mean of 0.75, -0.5 and 0.71
    assert row["cos"] == pytest.approx(0.7) and row["cos_sd"] == pytest.approx(0.1) and row["n"] == 3


@pytest.fixture(scope="module", params=["adamw", "muon"])
def start(shakespeare: str, request: pytest.FixtureRequest):
    """A tiny GPT a few data-parallel steps in, its optimizer's state (AdamW, or Muon on the hidden
    matrices), and batches for a round."""
    cfg = dict(gap_why.QUICK, sizes=["12k"], inner_optimizer=request.param)
    study = gap_why.Study(cfg, shakespeare, None)
    task, inner = study.task("12k"), study.inner(0.01)
    model = task.build_model(0)
    opt = gap_why.make_inner_optimizer(model, inner)
    stream = task.stream(0, 1, cfg["batch"], 0)
    assert type(opt).__name__ == {"adamw": "AdamW", "muon": "MuonWithAdamW"}[request.param]
    gap_why.steps(task, model, opt, [stream.batch_at(i) for i in range(5)])
    batches = [stream.batch_at(100 + i) for i in range(4)]
    own = [stream.batch_at(200 + i) for i in range(3)]
    return task, model, opt, batches, own, inner


def test_one_learner_is_data_parallel_and_the_probe_leaves_the_model_as_it_was(start):
    task, model, opt, batches, own, inner = start
    before = gap_why.flat(model).clone()
    cell = gap_why.probe(task, model, opt, batches, own, 1, 2, inner)
    assert cell["cos"] == pytest.approx(1.0, abs=1e-5) and cell["norm_ratio"] == pytest.approx(1.0, abs=1e-5)
    assert cell["gain_round"] == pytest.approx(cell["gain_dp"]) and cell["outer_lr"] == cell["dp_outer_lr"]
    assert torch.equal(gap_why.flat(model), before)


def test_learners_on_half_the_rows_each_go_somewhere_else_than_data_parallel(start):
    task, model, opt, batches, own, inner = start
    cell = gap_why.probe(task, model, opt, batches, own, 2, 2, inner)
    assert cell["cos"] < 0.999 and cell["learner_cos"] < 0.999  # two half batches: two other steps
    assert -1 <= cell["cos"] <= 1 and cell["norm_ratio"] > 0


def test_learners_batches_joined_are_data_parallels_batch_and_split_back_into_theirs():
    parts = [Batch(torch.full((2, 3), m), torch.full((2, 3), m + 10), tokens=6) for m in range(4)]
    joined = gap_why.join(parts)
    assert joined.inputs.shape == (8, 3) and joined.tokens == 24
    for m in range(4):  # `rows` gives learner m exactly its own batch back
        assert torch.equal(gap_why.rows(joined, m, 4).inputs, parts[m].inputs)
        assert torch.equal(gap_why.rows(joined, m, 4).targets, parts[m].targets)
