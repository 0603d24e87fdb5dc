"""One data-parallel run from start to summary: the run directory, the launcher, the evaluations.

This is what `ddiloco run --method ddp|elastic-ddp` calls (docs/dataparallel.md); the run directory
has the layout of `ddiloco run`'s (config.json, summary.json, metrics.jsonl, events.jsonl, learner-M/),
plus checkpoint/ and dataparallel.jsonl.
"""

from __future__ import annotations

import contextlib
import math
import signal
import threading
import time
from collections.abc import Callable, Sequence

import torch

from ..records.rundir import RunDir
from ..records.sinks import Sink
from ..train.tasks import count_parameters, make_task
from .config import DataParallelConfig
from .evaluation import CheckpointEvaluator, evaluate_checkpoint
from .launcher import Launcher
from .summary import summarize


def run_data_parallel(
    config: DataParallelConfig,
    launcher_factory: Callable[[DataParallelConfig], Launcher] = Launcher,
    sinks: Sequence[Sink] = (),
) -> dict:
    """Run to the budget (or an interrupt, or the time limit); returns the summary it wrote. Its
    "error" is None on a run that finished. `launcher_factory`: where the workers run (local processes,
    or Slurm jobs: `slurm.SlurmLauncher`); `sinks`: where metrics.jsonl's numbers also go (TensorBoard,
    wandb), closed at the end."""
    torch.set_num_threads(max(1, config.threads))
    task = make_task(config.model, config.data, seq_len=config.seq_len, model_size=config.model_size)
    params = count_parameters(task.build_model(config.seed))
    launcher = launcher_factory(config)
    record = RunDir(config.run_dir)
    record.write_config("run", config, clock_origin=launcher.start_wall)
    metrics = record.metrics(sinks)
    evaluator = CheckpointEvaluator(
        task, config.seed, config.checkpoint_dir, metrics, config.eval_every, launcher.start_wall, config.eval_batches
    )
    previous = {}
    if threading.current_thread() is threading.main_thread():
        for s in (signal.SIGINT, signal.SIGTERM):
            previous[s] = signal.signal(s, lambda signum, frame: launcher.interrupted.set())
    wall = time.perf_counter()
    evaluator.start()
    try:
        launcher.run()
    finally:
        evaluator.close()
        for s, handler in previous.items():
            signal.signal(s, handler)
    result = summarize(launcher.config, launcher, params, time.time())
    values: dict[str, float] = {"eval_loss": math.nan}
    with contextlib.suppress(OSError, ValueError, KeyError, RuntimeError):
        found = evaluate_checkpoint(task, config.seed, config.checkpoint_dir, config.eval_batches)
        if found is not None:
            values = found[0]
    if not result["finished"] and launcher.error is None:
        launcher.error = "the run ended before its budget"
    result.update(values, wall_seconds=time.perf_counter() - wall, error=launcher.error)
    metrics.write("eval", time.time() - launcher.start_wall, result["tokens"], **values)
    metrics.close()
    record.write_summary(result)
    return result
