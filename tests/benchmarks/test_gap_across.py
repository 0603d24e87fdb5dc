"""benchmarks/gap_across.py: the outer step of gap.py's tuned synchronous DiLoCo run, hooked per round.
The `tuned` variant must be the package's run itself (the hook and the probes it makes change nothing),
the oracle's search scales exactly the step the package's outer optimizer takes, and a rerun resumes
from the results file. A real tiny GPT on the bundled corpus; no timing."""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))

import gap  # noqa: E402
import gap_across  # noqa: E402

from ddiloco.core.outer import NesterovOuterOptimizer  # noqa: E402
from ddiloco.sim.run import run_sim  # noqa: E402
from ddiloco.train.corpus import encoded_corpus  # noqa: E402
from ddiloco.train.tasks import LanguageModelTask  # noqa: E402


@pytest.mark.parametrize("momentum", [0.0, 0.5])
def test_the_searched_update_scaled_by_eta_is_the_step_the_outer_optimizer_takes_at_lr_eta(momentum):
    gen = torch.Generator().manual_seed(0)
    params = {"a": torch.randn(5, 3, generator=gen), "b": torch.randn(4, generator=gen)}
    hooked = gap_across.RoundStep(0.7, momentum)
    plain = NesterovOuterOptimizer(0.7, momentum)
    theirs = {n: t.clone() for n, t in params.items()}
    for step, (eta, use_momentum) in enumerate([(0.7, True), (1.3, True), (0.4, True), (0.9, False)]):
        scaled = {n: (torch.randn(t.shape, generator=gen), 0.5 + step) for n, t in params.items()}
        update = hooked.update(scaled, use_momentum, 4)
        expected = {n: params[n] - eta * update[n] for n in params}
        hooked.lr = plain.lr = eta
        hooked.apply(params, scaled, use_momentum, 4)
        plain.apply(theirs, scaled, use_momentum, 4)
        for n in params:
            assert torch.allclose(params[n], expected[n], atol=1e-6)
            assert torch.equal(params[n], theirs[n])  # the hook is the package's step, bit for bit
    assert hooked.rounds == 4


def _last_json(out: str) -> dict:
    return json.loads(out.strip().splitlines()[-1])


def test_quick_run_tuned_is_the_sims_own_run_and_a_rerun_resumes(tmp_path, capsys, monkeypatch):
    path = tmp_path / "across.json"
    assert gap_across.main(["--quick", "--json", "--out", str(path), "--variants", "tuned", "oracle"]) == 0
    report = _last_json(capsys.readouterr().out)
    assert set(report) == {"summary", "ddp", "runs", "config"}
    assert set(report["summary"]) == {"variants", "points", "probe"}
    runs = {r["variant"]: r for r in report["runs"]}
    assert set(runs) == {"tuned", "oracle"}

    cfg = dict(gap_across.QUICK)
    task = LanguageModelTask(
        "gpt", gap.gpt("12k", cfg["seq_len"]), encoded_corpus(None, "byte", 1024, 0.1), "contiguous"
    )
    sim = run_sim(gap.sim_config(cfg, "12k", "diloco-m4", {**gap_across.TUNED, "seed": 0.0}, {}), task=task)
    assert runs["tuned"]["eval_loss"] == pytest.approx(sim["eval_loss"], rel=1e-9, abs=1e-9)
    assert runs["tuned"]["outer_steps"] == sim["outer_steps"]
    assert runs["oracle"]["eval_loss"] != pytest.approx(sim["eval_loss"], abs=1e-6)  # the search did act

    tuned = runs["tuned"]  # its search only looked: every step at the tuned rate
    assert tuned["chosen"] == [] and len(tuned["searched"]) == tuned["outer_steps"]
    assert all(x["lr"] == gap_across.TUNED["outer_lr"] for x in tuned["searched"])
    oracle = runs["oracle"]
    assert len(oracle["chosen"]) == oracle["outer_steps"]  # one searched scale per merge
    assert all(gap_across.EDGES[0] / 1.02 < eta < gap_across.EDGES[1] * 1.02 for eta in oracle["chosen"])
    points = runs["tuned"]["points"]
    assert [p["at"] for p in points] == list(gap_across.AT)
    for p in points:
        assert -1 <= p["cos"] <= 1 and p["norm_ratio"] > 0 and -1 <= p["built"]["cos"] <= 1
        assert len(p["loss_learners"]) == gap_across.M and math.isfinite(p["penalty"])
    rows = {r["variant"]: r for r in report["summary"]["variants"]}
    ddp = report["ddp"]["12k"]["0"]
    assert rows["tuned"]["gap_pct"] == [pytest.approx(100 * (runs["tuned"]["eval_loss"] / ddp - 1))]
    assert "eta_median" in rows["oracle"] and "gap_closed" in rows["oracle"]

    def ran(*args: object) -> dict:
        raise AssertionError("a saved run ran again")

    monkeypatch.setattr(gap_across.Across, "run", ran)
    assert gap_across.main(["--quick", "--json", "--out", str(path), "--variants", "tuned", "oracle"]) == 0
    assert _last_json(capsys.readouterr().out)["runs"] == report["runs"]
