"""One virtual-clock run, end to end: build the task, train with the chosen method, evaluate."""

from __future__ import annotations

import time
from collections.abc import Callable

import torch

from ..core.methods import DILOCO_METHODS
from ..train.tasks import Task, make_task
from .cluster import DecoupledCluster
from .config import SimConfig
from .ddp import DataParallel
from .recorder import SimRecorder

Progress = Callable[[float, dict], None]
Observer = Callable[[str, float, dict], None]


def build_task(config: SimConfig) -> Task:
    return make_task(
        config.model,
        config.data,
        seq_len=config.seq_len,
        model_size=config.model_size,
        tokenizer=config.tokenizer,
        bpe_vocab_size=config.bpe_vocab_size,
        shard_layout=config.shard_layout,
    )


def run_sim(
    config: SimConfig, task: Task | None = None, progress: Progress | None = None, observer: Observer | None = None
) -> dict:
    """Train `config` on the virtual clock; returns the summary of `ddiloco sim --json`.

    `observer(kind, time, details)` hears the run's events (the DiLoCo methods': down, up, join, merge,
    rejected; the data-parallel ones': down, up, generation; see `ddiloco.records.events.KINDS`).
    """
    wall_start = time.perf_counter()
    torch.manual_seed(config.seed)
    task = task if task is not None else build_task(config)
    driver = (
        DataParallel(config, task, progress, observer)
        if config.method in ("ddp", "elastic-ddp")
        else DecoupledCluster(config, task, progress, observer)
    )
    if isinstance(progress, SimRecorder):
        progress.driver = driver
    stats = driver.run()
    if isinstance(progress, SimRecorder):
        progress.finish(stats["sim_seconds"], stats["tokens_trained"])
    metrics = {
        **task.evaluate(driver.global_model(), max_batches=config.eval_batches),
        "eval_batches": config.eval_batches,
    }
    algorithm = config.effective_algorithm()
    result = {
        "method": config.method,
        "model": config.model,
        "learners": config.learners,
        "tokens": stats.pop("tokens_trained"),
        **metrics,
        "goodput": stats.pop("goodput"),
        "uptime": stats.pop("uptime"),
        "utilization": stats.pop("utilization"),
        "sim_seconds": stats.pop("sim_seconds"),
        **stats,
        "wall_seconds": time.perf_counter() - wall_start,
        "seed": config.seed,
    }
    if config.method in DILOCO_METHODS:
        result.update(
            fragments=algorithm.fragments,
            sync_every=algorithm.sync_every,
            overlap=algorithm.overlap,
            quorum=algorithm.quorum,
            grace=algorithm.grace,
            merge=algorithm.merge,
        )
    return result
