"""`ddiloco run --method ddp|elastic-ddp`: the data-parallel baselines (`ddiloco.dataparallel`) with
`ddiloco run`'s flags, its summary table and its --json line (docs/dataparallel.md)."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

from ..chaos.injector import ChaosSettings


def run_baseline(
    *,
    method: str,
    model: str,
    model_size: str,
    data: str | None,
    seq_len: int,
    learners: int,
    batch_size: int,
    inner_lr: float,
    seed: int,
    tokens: int | None,
    duration: float | None,
    sync_every: int,
    min_step_seconds: float,
    eval_batches: int,
    eval_every: float,
    threads: int,
    chaos: ChaosSettings,
    net: tuple[float, float, float] = (0.0, 0.0, 0.0),
    run_dir: Path | None,
    as_json: bool,
) -> None:
    """Run the baseline to its budget; exit 1 when it did not finish."""
    from ..dataparallel.config import DataParallelConfig
    from ..dataparallel.run import run_data_parallel
    from . import options
    from .output import print_summary, stderr

    config = DataParallelConfig(
        run_dir=run_dir or Path("runs") / time.strftime("run-%Y%m%d-%H%M%S"),
        method=method,
        model=model,
        model_size=model_size,
        data=data,
        seq_len=seq_len,
        workers=learners,
        batch_size=batch_size,
        inner_lr=inner_lr,
        seed=seed,
        tokens=tokens if tokens is not None or duration is not None else 400_000,
        duration=duration,
        checkpoint_every=sync_every,  # as often as a learner saves its inner optimizer state
        min_step_seconds=min_step_seconds,
        learner_down=chaos.learner_down,
        eval_batches=eval_batches,
        eval_every=eval_every,
        threads=options.shared_threads(threads, learners),
        chaos=chaos,
        net_latency=net[0],  # the all-reduce pays the emulated link (dataparallel/link.py)
        net_bandwidth=net[1],
        net_jitter=net[2],
    )
    result = run_data_parallel(config)
    print_summary(result, title=f"ddiloco run --method {method}")
    if result["error"]:
        stderr.print(f"[red]error:[/red] {result['error']}")
    if as_json:
        print(json.dumps(result, sort_keys=True), flush=True)
    if result["error"]:
        sys.exit(1)
