"""Evaluating the global model of a run, from the shards' checkpoints at the end or from parameters
fetched during the run (`learner.fetch`)."""

from __future__ import annotations

from pathlib import Path

import torch

from ..synchronizer.checkpoint import load_global_params
from ..train.tasks import Task


def evaluate_params(task: Task, seed: int, params: dict[str, torch.Tensor], max_batches: int) -> dict[str, float]:
    """The task's metrics of the model with `params`, on the first `max_batches` validation batches, and
    that count (`eval_batches`): every evaluation of a run says which yardstick it used."""
    model = task.build_model(seed)
    named = dict(model.named_parameters())
    missing = set(named) - set(params)
    if missing:
        raise ValueError(f"the global parameters lack {sorted(missing)[:3]}")
    with torch.no_grad():
        for name, p in named.items():
            p.copy_(params[name])
    return {**task.evaluate(model, max_batches=max_batches), "eval_batches": max_batches}


def evaluate_checkpoints(task: Task, seed: int, sync_dirs: list[Path], max_batches: int) -> dict[str, float]:
    params, _ = load_global_params(sync_dirs)
    return evaluate_params(task, seed, params, max_batches)
