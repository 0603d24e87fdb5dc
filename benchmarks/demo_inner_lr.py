"""The inner optimizer and its learning rate at the demo's size: `ddiloco demo`'s own scenario (the
~1M-parameter GPT, 4 learners failing every 30 simulated seconds for 8, the scaled link, 400k tokens,
its outer lr 1 and no momentum), one method and inner optimizer and peak inner lr per run, on the
virtual clock. It is what chose the default inner optimizer's lr beside gap.py's sweeps at
84k-237k (docs/results.md, "The inner optimizer's default"): each (method, optimizer)'s grid is
widened until its best lr is strictly inside it.

Every run is saved as it ends (`tuning.Tuner`), and a rerun with the same --out resumes.

    python benchmarks/demo_inner_lr.py --out benchmarks/results/demo-inner-lr.json --json   # ~20 runs, ~15 min
    python benchmarks/demo_inner_lr.py --quick --json      # the tiny model, 40k tokens: a check, ~1 min
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from pathlib import Path

from rich.console import Console

sys.path.insert(0, str(Path(__file__).resolve().parent))
from tuning import Setting, Tuner  # noqa: E402

from ddiloco.chaos.trace import random_trace  # noqa: E402
from ddiloco.cli.demo import scaled_link  # noqa: E402
from ddiloco.core.config import AlgorithmConfig  # noqa: E402
from ddiloco.sim.config import SimConfig  # noqa: E402
from ddiloco.sim.run import build_task, run_sim  # noqa: E402
from ddiloco.train.inner import DEFAULT_LR, InnerConfig  # noqa: E402

console = Console(stderr=True)
METHODS = ("decoupled", "ddp")
OPTIMIZERS = ("muon", "adamw")


def demo_config(method: str, optimizer: str, lr: float, seed: int, tokens: int, model_size: str) -> SimConfig:
    """`ddiloco demo`'s configuration (cli/demo.py) with this method, inner optimizer and lr."""
    learners, batch, seq_len = 4, 8, 64
    horizon = 16.0 * tokens / (learners * batch * seq_len)
    return SimConfig(
        method=method,  # type: ignore[arg-type]
        model_size=model_size,  # type: ignore[arg-type]
        seq_len=seq_len,
        learners=learners,
        tokens=tokens,
        seed=seed,
        algorithm=AlgorithmConfig(fragments=4, sync_every=12, overlap=2, outer_lr=1.0, outer_momentum=0.0),
        inner=InnerConfig(batch_size=batch, optimizer=optimizer, lr=lr),  # type: ignore[arg-type]
        failures=random_trace(learners, horizon, 30.0, 8.0, seed=seed + 1),
    )


def run_one(method: str, optimizer: str, lr: float, seed: int, tokens: int, model_size: str) -> float:
    config = demo_config(method, optimizer, lr, seed, tokens, model_size)
    task = build_task(config)
    params = sum(p.numel() for p in task.build_model(seed).parameters())
    config = dataclasses.replace(config, link=scaled_link(params, 0.05))
    return float(run_sim(config, task=task)["eval_loss"])


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true", help="the tiny model at 40k tokens")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", type=Path, default=None, help="results file (resumed from if it exists)")
    p.add_argument("--json", action="store_true", help="end with one JSON line: the choices")
    args = p.parse_args(argv)
    model_size, tokens = ("tiny", 40_000) if args.quick else ("default", 400_000)
    context = {"model_size": model_size, "tokens": tokens, "seed": args.seed}

    def objective(key: str, settings: dict[str, float]) -> float:
        method, optimizer = key.split("/")
        return run_one(method, optimizer, settings["inner_lr"], args.seed, tokens, model_size)

    tuner = Tuner(objective, args.out, context, say=console.print)
    choices = {}
    for method in METHODS:
        for optimizer in OPTIMIZERS:
            key = f"{method}/{optimizer}"
            # each optimizer's grid starts around its own default lr (train.inner.DEFAULT_LR)
            r = tuner.tune(key, [Setting("inner_lr", DEFAULT_LR[optimizer])])  # type: ignore[index]
            lr = r["chosen"]["inner_lr"]
            choices[key] = {
                "grid": r["grid"]["inner_lr"],
                "chosen": lr,
                "bracketed": r["bracketed"]["inner_lr"],
                "eval_loss": tuner.loss(key, {"inner_lr": lr}),
            }
            console.print(
                f"{key}: best lr {lr:g} in {choices[key]['grid']} (eval loss {choices[key]['eval_loss']:.4f})"
            )
    if args.json:
        print(json.dumps({"choices": choices, "default_lr": dict(DEFAULT_LR), **context}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
