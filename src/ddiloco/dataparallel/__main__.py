"""`python -m ddiloco.dataparallel run ...` (a data-parallel run) and `... worker ...` (one worker,
as the launcher starts it). Until `ddiloco run --method ddp|elastic-ddp` is wired, this is the
command line; its flags are spelled as `ddiloco run`'s."""

from __future__ import annotations

import argparse
import json
import logging
import sys
from pathlib import Path

from ..chaos.injector import ChaosSettings
from ..learner.wan import LinkConfig
from ..records import logsetup
from ..train.inner import INNER_OPTIMIZERS, InnerConfig
from ..train.streams import SHARD_LAYOUTS
from .config import PRECISIONS

_INNER = InnerConfig()


def _common(p: argparse.ArgumentParser) -> None:
    p.add_argument("--run-dir", type=Path, required=True)
    p.add_argument("--model", default="gpt")
    p.add_argument("--model-size", default="default")
    p.add_argument("--data")
    p.add_argument("--seq-len", type=int, default=128)
    p.add_argument("--shard-layout", choices=SHARD_LAYOUTS, default=SHARD_LAYOUTS[0], help="how the text is dealt")
    p.add_argument("--batch-size", type=int, default=_INNER.batch_size)  # the defaults: InnerConfig's
    p.add_argument("--inner-lr", type=float, default=None, help="default: the optimizer's (train.inner.DEFAULT_LR)")
    p.add_argument("--inner-optimizer", choices=INNER_OPTIMIZERS, default=_INNER.optimizer)
    p.add_argument(
        "--slow-momentum", type=float, default=_INNER.slow_momentum, help="MT-DAO's slow inner momentum (0: off)"
    )
    p.add_argument("--slow-weight", type=float, default=_INNER.slow_weight, help="its share of the step")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--tokens", type=int)
    p.add_argument("--duration", type=float)
    p.add_argument("--checkpoint-every", type=int, default=24)
    p.add_argument("--min-step-seconds", type=float, default=0.0)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--device", default="auto")
    p.add_argument("--collective-timeout", type=float, default=30.0)
    p.add_argument("--join-timeout", type=float, default=300.0)
    p.add_argument("--net-latency", type=float, default=0.0, help="ms one way per hop of the all-reduce's ring")
    p.add_argument("--net-bandwidth", type=float, default=0.0, help="MB/s each way per worker; 0: no cap")
    p.add_argument("--net-jitter", type=float, default=0.0, help="ms: a uniform 0..J added to each hop")
    p.add_argument("--allreduce-precision", choices=PRECISIONS, default="bf16", help="what it sends and sums in")


def parser() -> argparse.ArgumentParser:
    top = argparse.ArgumentParser(prog="python -m ddiloco.dataparallel")
    sub = top.add_subparsers(dest="command", required=True)
    run = sub.add_parser("run", help="M workers in one data-parallel job, supervised, with chaos")
    _common(run)
    run.add_argument("--method", choices=("ddp", "elastic-ddp"), default="ddp")
    run.add_argument("--learners", type=int, default=4, help="workers M")
    run.add_argument("--min-workers", type=int, default=1)
    run.add_argument("--learner-mtbf", type=float)
    run.add_argument("--learner-down", type=float, default=15.0)
    run.add_argument("--chaos-trace", type=Path)
    run.add_argument("--straggle", type=float, help="SIGSTOP a random worker for this many seconds now and then")
    run.add_argument("--straggle-every", type=float, default=30.0)
    run.add_argument("--eval-batches", type=int, default=20)
    run.add_argument("--eval-every", type=float, default=20.0)
    run.add_argument("--time-limit", type=float, default=24 * 3600.0)
    run.add_argument(
        "--stall-limit",
        type=float,
        default=1800.0,
        help="end the run with an error when no generation formed for this many seconds with its workers running",
    )
    run.add_argument("--json", action="store_true", dest="as_json")
    worker = sub.add_parser("worker", help="one worker (started by the launcher)")
    _common(worker)
    worker.add_argument("--slot", type=int, required=True)
    worker.add_argument("--store-port", type=int, required=True)
    worker.add_argument("--workers", type=int, required=True)
    worker.add_argument("--clock-origin", type=float, default=0.0)
    worker.add_argument("--store-host", default="127.0.0.1", help="where the launcher's store listens")
    worker.add_argument("--incarnation", type=int, help="on Slurm: the job's restart count")
    worker.add_argument("--store-secret-file", type=Path, help="the store's secret (a 0600 file, never the secret)")
    return top


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    if args.command == "worker":
        from .worker import Worker, WorkerSettings

        logsetup.configure(f"worker{args.slot}", "info")
        import torch

        torch.set_num_threads(max(1, args.threads))
        fields = {k: v for k, v in vars(args).items() if k not in ("command", "threads")}
        code = Worker(WorkerSettings(**fields)).run()
        # Its groups are left and its books written: end without interpreter finalization, during which
        # a process that held a gloo group can be aborted by the C++ runtime (SIGABRT; `ddiloco learner`
        # saw it under torchrun), and a launcher would take a finished worker for a crashed one.
        logsetup.exit_now(code)
    from ..chaos.trace import FailureTrace
    from .config import DataParallelConfig
    from .run import run_data_parallel

    logsetup.configure("dataparallel", "warning")
    trace = FailureTrace.load(args.chaos_trace) if args.chaos_trace else None
    chaos = ChaosSettings(
        learner_mtbf=args.learner_mtbf,
        learner_down=args.learner_down,
        straggle=args.straggle,
        straggle_every=args.straggle_every,
        trace=trace,
        seed=args.seed,
    )
    config = DataParallelConfig(
        run_dir=args.run_dir,
        method=args.method,
        model=args.model,
        model_size=args.model_size,
        data=args.data,
        seq_len=args.seq_len,
        shard_layout=args.shard_layout,
        workers=args.learners,
        inner=InnerConfig(
            lr=args.inner_lr,
            batch_size=args.batch_size,
            optimizer=args.inner_optimizer,
            slow_momentum=args.slow_momentum,
            slow_weight=args.slow_weight,
        ),
        seed=args.seed,
        tokens=args.tokens if args.tokens is not None or args.duration is not None else 400_000,
        duration=args.duration,
        checkpoint_every=args.checkpoint_every,
        min_step_seconds=args.min_step_seconds,
        min_workers=args.min_workers,
        learner_down=args.learner_down,
        eval_batches=args.eval_batches,
        eval_every=args.eval_every,
        threads=args.threads,
        device=args.device,
        collective_timeout=args.collective_timeout,
        join_timeout=args.join_timeout,
        time_limit=args.time_limit,
        stall_limit=args.stall_limit,
        link=LinkConfig(args.net_latency, args.net_bandwidth, args.net_jitter),
        allreduce_precision=args.allreduce_precision,
        chaos=chaos,
    )
    result = run_data_parallel(config)
    if args.as_json:
        print(json.dumps(result, sort_keys=True), flush=True)
    else:
        keys = ("method", "tokens_trained", "tokens_merged", "tokens_lost", "goodput", "eval_loss", "run_seconds")
        print("  ".join(f"{k}={result[k]}" for k in keys), flush=True)
    logging.shutdown()
    return 0 if result["error"] is None else 1


if __name__ == "__main__":
    sys.exit(main())
