"""Learner overhead: the step time of a learner that syncs one fragment every step (P = H) against
the very same training loop without any synchronizer, measured side by side in one run.

A real `ddiloco synchronizer` runs in its own process (write-ahead checkpoints on, as by default);
the learner loop runs here. Blocks of plain steps and of steps with `client.step(...)` alternate,
so that both modes see the same machine load, in the order plain, client, client, plain, ...: the
step time drifts during a run (on this CPU a GPT's steps slowed by about 10 % per 8 steps at 10M
parameters in both modes: denormal numbers appearing as it trains), and with plain always first in
each pair the drift read as 9-10 % of overhead. Denormals are flushed to zero in both modes
(`torch.set_flush_denormal`; `--keep-denormals` keeps them, and the drift), which removes the drift.
The ratio is mean(with client) / mean(plain).

    python benchmarks/overhead.py                      # default GPT (~0.9M parameters), ~2 minutes
    python benchmarks/overhead.py --quick --json       # tiny model, seconds
    python benchmarks/overhead.py --model-size 10m --blocks 4 --block-steps 12 --json   # 10.9M parameters
    python benchmarks/overhead.py --model-size 50m --blocks 3 --block-steps 8 --json    # 49.6M parameters
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch
from rich.console import Console
from rich.table import Table

from ddiloco.launch.procs import ProcessTable, ddiloco_command
from ddiloco.learner.client import LearnerClient
from ddiloco.train.inner import InnerConfig, inner_step, make_inner_optimizer
from ddiloco.train.tasks import make_task

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_DATA = ROOT.parent / "shared" / "data" / "tinyshakespeare.txt"
console = Console(stderr=True)


def start_synchronizer(procs: ProcessTable, tmp: Path, args: argparse.Namespace) -> str:
    address_file = tmp / "address"
    cmd = ddiloco_command(
        "synchronizer",
        "--port",
        "0",
        "--address-file",
        str(address_file),
        "--model",
        "gpt",
        "--model-size",
        args.model_size,
        "--seq-len",
        str(args.seq_len),
        "--data",
        str(args.data),
        "--fragments",
        str(args.fragments),
        "--sync-every",
        str(args.fragments),
        "--overlap",
        "2",
        "--checkpoint-dir",
        str(tmp / "ckpt"),
        "--threads",
        "1",
        "--learners",
        "1",
        "--log-level",
        "warning",
    )
    child = procs.start("sync", cmd, tmp / "sync.log")
    deadline = time.monotonic() + 120
    while not address_file.is_file():
        if not child.alive() or time.monotonic() > deadline:
            raise RuntimeError(f"the synchronizer did not start: {(tmp / 'sync.log').read_text()[-2000:]}")
        time.sleep(0.05)
    return address_file.read_text().strip()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model-size", default="default")
    p.add_argument("--seq-len", type=int, default=128)
    p.add_argument("--batch-size", type=int, default=16)
    p.add_argument("--fragments", type=int, default=24, help="P = H: one fragment is synced every step")
    p.add_argument("--blocks", type=int, default=8, help="blocks of each mode, alternating")
    p.add_argument("--block-steps", type=int, default=24)
    p.add_argument("--codec", default="bf16")
    p.add_argument("--threads", type=int, default=1, help="torch threads of the learner")
    p.add_argument("--data", type=Path, default=DEFAULT_DATA)
    p.add_argument("--quick", action="store_true", help="tiny model, few steps")
    p.add_argument(
        "--keep-denormals",
        action="store_true",
        help="do not flush denormal numbers to zero (both modes then slow down as the run goes on)",
    )
    p.add_argument("--json", action="store_true", help="end with one JSON line of the figures")
    args = p.parse_args()
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))  # so `finally` ends the children
    if args.quick:
        args.model_size, args.seq_len, args.batch_size, args.fragments = "tiny", 64, 16, 8
        args.blocks, args.block_steps = 4, 16
    torch.set_num_threads(args.threads)
    flushed = not args.keep_denormals and torch.set_flush_denormal(True)
    task = make_task("gpt", str(args.data), seq_len=args.seq_len, model_size=args.model_size)
    model = task.build_model(0)
    optimizer = make_inner_optimizer(model, InnerConfig(batch_size=args.batch_size))
    stream = task.stream(0, 1, args.batch_size, 0)
    procs = ProcessTable()
    times: dict[str, list[float]] = {"plain": [], "client": []}
    with tempfile.TemporaryDirectory() as tmp:
        try:
            address = start_synchronizer(procs, Path(tmp), args)
            client = LearnerClient(model, address, 0, codec=args.codec)
            client.start()

            def run(mode: str, steps: int, record: bool) -> None:
                for _ in range(steps):
                    t0 = time.perf_counter()
                    batch = stream.next()
                    inner_step(model, optimizer, task.loss(model, batch), 1.0)
                    if mode == "client":
                        client.step(batch.tokens, position=stream.position)
                    if record:
                        times[mode].append(time.perf_counter() - t0)

            run("plain", args.block_steps, False)  # warm-up: allocator, caches, the synchronizer's first merges
            run("client", args.block_steps, False)
            for i in range(args.blocks):  # ABBA: a steady drift of the step time cancels out
                for mode in ("plain", "client") if i % 2 == 0 else ("client", "plain"):
                    run(mode, args.block_steps, True)
            stats = client.finish(timeout=10)
        finally:
            procs.stop_all()
    plain, synced = statistics.mean(times["plain"]), statistics.mean(times["client"])
    result = {
        "model_size": args.model_size,
        "parameters": sum(p.numel() for p in model.parameters()),
        "fragments": args.fragments,
        "codec": args.codec,
        "steps_each": len(times["plain"]),
        "plain_step_ms": 1000 * plain,
        "client_step_ms": 1000 * synced,
        "plain_median_ms": 1000 * statistics.median(times["plain"]),
        "client_median_ms": 1000 * statistics.median(times["client"]),
        "contributions_accepted": stats["accepted"],
        "contributions_pushed": stats["pushed"],
        "ratio": synced / plain,
        "cpus": os.cpu_count(),
        "synchronizer_on_same_cores": True,
        "denormals_flushed": bool(flushed),
    }
    table = Table(title="learner overhead: syncing one fragment every step (P = H)")
    for col in ("mode", "mean step (ms)", "median step (ms)"):
        table.add_column(col, justify="right")
    table.add_row("no synchronizer", f"{result['plain_step_ms']:.2f}", f"{result['plain_median_ms']:.2f}")
    table.add_row("with client", f"{result['client_step_ms']:.2f}", f"{result['client_median_ms']:.2f}")
    console.print(table)
    console.print(
        f"ratio (with / without): [bold]{result['ratio']:.3f}[/bold] (aim: <= 1.03 at 50M); "
        f"{stats['accepted']} of {stats['pushed']} contributions accepted"
    )
    console.print(
        f"the synchronizer process (merges, checkpoints) shares this machine's {result['cpus']} CPU cores "
        "with the learner: its work counts against the ratio"
    )
    if args.json:
        print(json.dumps(result, sort_keys=True))
    sys.exit(0)


if __name__ == "__main__":
    main()
