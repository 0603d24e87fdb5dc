"""Data-parallel baselines in real processes, with a real kill -9 (docs/dataparallel.md).

Two workers of the tiny GPT on tinyshakespeare. What is checked is what the baselines guarantee:
the budget is reached, every token is accounted (trained = merged + lost), `ddp` resumes from its
checkpoint after a kill (and ends with exactly the model of a run without one: the same steps on
the same data), `elastic-ddp` goes on with the survivor, the same process, and takes the
replacement back.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from ddiloco.dataparallel.checkpoint import MODEL, read_manifest
from ddiloco.train.tasks import make_task

from .runs import SEQ, TOKENS_PER_WORKER_STEP, finish, generations, journals, kill_worker, running, wait_for_checkpoint

DDP_TOKENS = 2 * TOKENS_PER_WORKER_STEP * 100  # 100 steps of both workers


def initial_loss(data: str) -> float:
    task = make_task("gpt", data, seq_len=SEQ, model_size="tiny")
    return task.evaluate(task.build_model(0), max_batches=8)["eval_loss"]


def final_params(run_dir: Path) -> dict[str, torch.Tensor]:
    manifest = read_manifest(run_dir / "checkpoint")
    assert manifest is not None and manifest["final"]
    return load_file(str(run_dir / "checkpoint" / manifest["folder"] / MODEL))


def check_accounting(result: dict, budget: int) -> None:
    assert result["error"] is None and result["finished"]
    assert result["tokens_merged"] >= budget
    assert result["tokens_trained"] == result["tokens_merged"] + result["tokens_lost"]
    assert result["tokens_merged"] <= result["tokens_trained"]  # the lineage's count against the workers' journals
    assert 0 < result["goodput"] <= result["utilization"] <= 1.0 + 1e-9


@pytest.fixture(scope="module")
def clean_ddp(shakespeare: str, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict]:
    run_dir = tmp_path_factory.mktemp("dp") / "clean"
    with running(run_dir, shakespeare, "ddp", DDP_TOKENS) as launcher:
        return run_dir, finish(launcher, run_dir)


def test_ddp_without_failures_trains_its_budget_and_every_token_is_merged(clean_ddp, shakespeare: str):
    run_dir, result = clean_ddp
    check_accounting(result, DDP_TOKENS)
    assert result["tokens_trained"] == result["tokens_merged"] == DDP_TOKENS  # nothing lost, nothing over
    assert result["inner_steps"] == 100 and result["job_restarts"] == 0 and result["learner_processes"] == 2
    assert math.isfinite(result["eval_loss"]) and result["eval_loss"] < initial_loss(shakespeare)
    for name in ("config.json", "summary.json", "metrics.jsonl", "events.jsonl"):
        assert (run_dir / name).is_file(), name
    assert {p.suffix for p in (run_dir / "checkpoint").rglob("*") if p.is_file()} <= {".json", ".safetensors"}


def test_ddp_restarts_the_job_from_its_checkpoint_after_a_kill(clean_ddp, shakespeare: str, tmp_path: Path):
    run_dir = tmp_path / "ddp-kill"
    with running(run_dir, shakespeare, "ddp", DDP_TOKENS) as launcher:
        wait_for_checkpoint(run_dir, 20, launcher)
        kill_worker(run_dir, 1)
        result = finish(launcher, run_dir)
    check_accounting(result, DDP_TOKENS)
    assert result["job_restarts"] == 1 and result["learner_processes"] == 4
    for slot in (0, 1):  # the whole job was restarted: each worker ran in two processes
        first, second = journals(run_dir, slot)
        assert first["start_step"] == 0
        assert second["start_step"] >= 20 and second["start_step"] % 10 == 0  # read the checkpoint at start
    # the steps after the checkpoint were trained again on the same data: exactly the clean run's model
    clean = final_params(clean_ddp[0])
    for name, value in final_params(run_dir).items():
        assert torch.equal(value, clean[name]), name
    assert result["eval_loss"] == clean_ddp[1]["eval_loss"]


def test_ddp_trains_with_the_inner_optimizer_options_a_learner_has(shakespeare: str, tmp_path: Path):
    """Muon reaches the workers (`ddiloco run --method ddp --inner-optimizer muon`: a fair comparison),
    whose ranks start from rank 0's Muon and AdamW state (`replicated.broadcast_state`) and checkpoint it."""
    run_dir = tmp_path / "ddp-muon"
    tokens = 2 * TOKENS_PER_WORKER_STEP * 30
    with running(run_dir, shakespeare, "ddp", tokens, "--inner-optimizer", "muon") as launcher:
        result = finish(launcher, run_dir)
    check_accounting(result, tokens)
    assert math.isfinite(result["eval_loss"]) and result["eval_loss"] < initial_loss(shakespeare)
    manifest = read_manifest(run_dir / "checkpoint")
    assert manifest is not None
    meta = json.loads((run_dir / "checkpoint" / manifest["folder"] / "inner.json").read_text())
    assert {g["kind"] for g in meta["param_groups"]} == {"muon", "adamw"}


ELASTIC_TOKENS = TOKENS_PER_WORKER_STEP * 500  # room for the survivor alone while the replacement starts


def test_elastic_ddp_goes_on_with_the_survivor_and_takes_the_replacement_back(shakespeare: str, tmp_path: Path):
    run_dir = tmp_path / "elastic-kill"
    with running(run_dir, shakespeare, "elastic-ddp", ELASTIC_TOKENS, "--eval-every", "1") as launcher:
        wait_for_checkpoint(run_dir, 20, launcher)
        kill_worker(run_dir, 1)
        result = finish(launcher, run_dir)
    check_accounting(result, ELASTIC_TOKENS)
    assert result["job_restarts"] == 0
    formed = generations(run_dir)
    worlds = [g["members"] for g in formed]
    assert worlds[0] == [0, 1]
    alone = worlds.index([0])  # the survivor went on by itself ...
    assert [0, 1] in worlds[alone + 1 :]  # ... and the replacement was taken back
    assert formed[alone + 1]["step"] > formed[alone]["step"]  # the survivor trained steps alone
    assert len(journals(run_dir, 0)) == 1  # the survivor is the same process throughout
    first, replacement = journals(run_dir, 1)
    assert replacement["merged_steps"] > 0
    assert math.isfinite(result["eval_loss"]) and result["eval_loss"] < initial_loss(shakespeare)
    metrics = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert metrics[-1]["kind"] == "eval" and metrics[-1]["eval_loss"] == result["eval_loss"]
    evals = [m for m in metrics if m["kind"] == "eval"]  # the curve on the final evaluation's yardstick
    assert len(evals) >= 2 and {m["eval_batches"] for m in evals} == {8} and result["eval_batches"] == 8
