"""benchmarks/noise_scale.py: the simple noise scale B_simple = tr(Sigma) / |G|^2 from mean squared
gradient norms at two batch sizes (McCandlish et al. 2018, A.1). The estimator against hand-computed
values and against a model whose per-sequence gradients are known exactly; the summary's ratio of
means; the real tiny GPT's probe leaves the model as it was. No timing."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))

import gap_why  # noqa: E402
import noise_scale  # noqa: E402

from ddiloco.train.streams import Batch  # noqa: E402


def test_the_estimates_invert_the_expected_squared_norms_by_hand():
    # |G|^2 = 1, tr(Sigma) = 8: E S_4 = 1 + 8 / 4 = 3, E S_64 = 1 + 8 / 64 = 1.125
    g2, trace = noise_scale.estimates(3.0, 1.125)
    assert g2 == pytest.approx(1.0) and trace == pytest.approx(8.0)
    # no noise at all: every batch's gradient is G, whatever its size
    assert noise_scale.estimates(2.0, 2.0) == (pytest.approx(2.0), pytest.approx(0.0))


class _Rows:
    """A stream of batches whose sequences each carry one value x: the loss is mean(w * x), so a
    sequence's gradient is x and the batch's is the batch mean of x."""

    def __init__(self, batch: int, seed: int) -> None:
        self.batch, self.gen = batch, torch.Generator().manual_seed(seed)

    def batch_at(self, index: int) -> Batch:
        x = 3.0 + 2.0 * torch.randn(self.batch, 1, generator=self.gen)  # G = 3, Sigma = 4 per coordinate
        return Batch(x, x, tokens=self.batch)


class _Task:
    def stream(self, rank: int, ranks: int, batch: int, seed: int) -> _Rows:
        return _Rows(batch, seed)

    def loss(self, model: torch.nn.Module, batch: Batch) -> torch.Tensor:
        return (model.weight * batch.inputs).sum(dim=1).mean()


def test_a_model_with_known_gradient_noise_gives_its_noise_scale():
    model = torch.nn.Linear(1, 1, bias=False)  # one coordinate: |G|^2 = 9, tr(Sigma) = 4, B_simple 4 / 9
    task = _Task()
    s_small = noise_scale.mean_squared_norm(task, model, noise_scale.B_SMALL, 4000, 0)  # type: ignore[arg-type]
    s_big = noise_scale.mean_squared_norm(task, model, noise_scale.B_BIG, 4000, 1)  # type: ignore[arg-type]
    assert s_small == pytest.approx(9 + 4 / 4, rel=0.05) and s_big == pytest.approx(9 + 4 / 64, rel=0.02)
    g2, trace = noise_scale.estimates(s_small, s_big)
    assert g2 == pytest.approx(9.0, rel=0.02) and trace == pytest.approx(4.0, rel=0.25)
    assert model.weight.grad is None  # the probe leaves no gradient behind


def test_the_summary_takes_the_ratio_of_the_seeds_mean_estimates():
    cells = [
        {"size": "84k", "seed": s, "at": 0.5, "g2": g2, "trace": tr, "s_small": 0.0, "s_big": 0.0}
        for s, (g2, tr) in enumerate(((1.0, 10.0), (3.0, 10.0)))
    ]
    (row,) = noise_scale.summarize(cells, seq_len=64)
    assert row["b_simple"] == pytest.approx(10.0 / 2.0)  # not the mean of 10 and 3.33
    assert row["per_seed"] == pytest.approx([10.0, 10.0 / 3.0]) and row["b_simple_tokens"] == pytest.approx(320.0)


def test_the_probe_on_a_real_gpt_leaves_its_parameters_and_gives_positive_squared_norms(shakespeare):
    study = gap_why.Study(dict(gap_why.QUICK, sizes=["12k"]), shakespeare, None)
    task = study.task("12k")
    model = task.build_model(0)
    before = gap_why.flat(model).clone()
    small = noise_scale.mean_squared_norm(task, model, noise_scale.B_SMALL, 3, 7)
    big = noise_scale.mean_squared_norm(task, model, noise_scale.B_BIG, 2, 8)
    assert 0 < big < small  # a batch of 64 averages away most of the noise of a batch of 4
    assert torch.equal(gap_why.flat(model), before)
    assert all(p.grad is None for p in model.parameters())


def test_quick_json_has_a_noise_scale_per_size_and_point(capsys, shakespeare, tmp_path):
    out = tmp_path / "noise.json"
    args = ["--quick", "--json", "--sizes", "12k", "--seeds", "1", "--data", shakespeare, "--out", str(out)]
    assert noise_scale.main(args) == 0
    result = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert [(r["size"], r["at"]) for r in result["summary"]] == [("12k", a) for a in gap_why.AT]
    assert all(r["b_simple"] == pytest.approx(r["trace"] / r["g2"]) for r in result["summary"])
    assert result["config"]["b_small"] == noise_scale.B_SMALL and result["inner_lr"]["12k"] > 0
    assert noise_scale.main(args) == 0  # resumed from the file: the same cells, none measured again
    again = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert again["cells"] == result["cells"]


def test_muon_runs_at_its_own_lr_and_never_resumes_an_adamw_file(capsys, shakespeare, tmp_path):
    out = tmp_path / "noise.json"
    args = ["--quick", "--json", "--sizes", "12k", "--seeds", "1", "--data", shakespeare, "--out", str(out)]
    assert noise_scale.main(args) == 0
    adamw = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert noise_scale.main([*args, "--inner-optimizer", "muon"]) == 0
    muon = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert "inner_optimizer" not in adamw["config"] and muon["config"]["inner_optimizer"] == "muon"
    # Muon's grid is centred on its own default lr (0.012), 4x AdamW's: the chosen rates differ
    assert muon["inner_lr"]["12k"] != adamw["inner_lr"]["12k"]
    assert muon["cells"] != adamw["cells"]  # measured again along Muon's run, not resumed
    assert json.loads(out.read_text())["config"]["inner_optimizer"] == "muon"
