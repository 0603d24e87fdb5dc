"""Quality at equal tokens: Decoupled DiLoCo against its baselines on the virtual clock.

Every configuration trains the same model on the same data shards for the same token budget; the
failure schedule (each learner down about 10 % of the time) and the heterogeneity (half the learners
1.2x slower, +-10 % jitter) are the same wherever they apply. Prints one table and writes it as JSON.

    python benchmarks/quality.py            # ~20 minutes on 2 cores
    python benchmarks/quality.py --quick    # under 2 minutes (tiny models, small budget)
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import replace
from pathlib import Path

from rich.console import Console
from rich.table import Table

from ddiloco.chaos.trace import random_trace
from ddiloco.core import AlgorithmConfig
from ddiloco.sim.config import SimConfig
from ddiloco.sim.hardware import StepTimeModel, half_slow
from ddiloco.sim.run import build_task, run_sim
from ddiloco.train.inner import INNER_OPTIMIZERS, InnerConfig, InnerOptimizer

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_DATA = ROOT.parent / "shared" / "data" / "tinyshakespeare.txt"
console = Console(stderr=True)

LEARNERS = 4
# Each learner fails as a Poisson process (mean 90 steps apart) and stays down 10 steps on average:
# down about 10 % of the time.
MTBF_STEPS, DOWN_STEPS = 90.0, 10.0


def rows(learners: int, period: int) -> list[tuple[str, dict]]:
    """Decoupled DiLoCo with its defaults (late work merged, in-flight steps kept, no momentum in the
    final flush) and as the paper has it ("-paper": late work refused, in-flight steps overwritten,
    momentum to the end), beside the baselines."""
    decoupled = AlgorithmConfig(fragments=4, sync_every=period, overlap=2, quorum=1, grace=0.9)
    paper = replace(decoupled, arrival="overwrite", late="refuse", final_momentum=True)
    hetero = StepTimeModel(speeds=half_slow(learners, 1.2), jitter=0.1)
    return [
        ("ddp", dict(method="ddp")),
        ("ddp-failures", dict(method="ddp", failures=True)),
        ("elastic-ddp-failures", dict(method="elastic-ddp", failures=True)),
        ("diloco", dict(method="diloco", algorithm=replace(decoupled, merge="mean"))),
        ("decoupled", dict(method="decoupled", algorithm=decoupled)),
        ("decoupled-failures", dict(method="decoupled", algorithm=decoupled, failures=True)),
        ("decoupled-paper", dict(method="decoupled", algorithm=paper)),
        ("decoupled-paper-failures", dict(method="decoupled", algorithm=paper, failures=True)),
        (
            "decoupled-hetero-km",
            dict(method="decoupled", algorithm=replace(decoupled, quorum=learners, grace=0.0), steps=hetero),
        ),
        ("decoupled-hetero-k1", dict(method="decoupled", algorithm=replace(decoupled, grace=0.0), steps=hetero)),
        ("decoupled-hetero-k1-grace", dict(method="decoupled", algorithm=decoupled, steps=hetero)),
        ("decoupled-paper-hetero-k1", dict(method="decoupled", algorithm=replace(paper, grace=0.0), steps=hetero)),
    ]


def plan(quick: bool) -> list[dict]:
    """(model, size, tokens, batch, seq_len) per model family."""
    if quick:
        return [
            dict(model="gpt", size="tiny", tokens=120_000, batch=8, seq_len=64),
            dict(model="gpt-moe", size="tiny", tokens=80_000, batch=8, seq_len=64),
            dict(model="vision", size="tiny", tokens=6_000, batch=16, seq_len=64),
        ]
    return [
        dict(model="gpt", size="default", tokens=1_500_000, batch=16, seq_len=128),
        dict(model="gpt-moe", size="default", tokens=600_000, batch=16, seq_len=128),
        dict(model="vision", size="default", tokens=40_000, batch=32, seq_len=128),
    ]


def configs(
    spec: dict, seed: int, data: str, period: int, reconfigure: float, optimizer: InnerOptimizer | None = None
) -> list[tuple[str, SimConfig]]:
    """Every row's configuration; `optimizer`: the inner optimizer (None: the package's default), at its
    own default lr."""
    steps_per_learner = spec["tokens"] / (
        LEARNERS * spec["batch"] * (1 if spec["model"] == "vision" else spec["seq_len"])
    )
    horizon = 4 * steps_per_learner
    trace = random_trace(LEARNERS, horizon, MTBF_STEPS, DOWN_STEPS, seed=seed + 100)
    out = []
    for name, kw in rows(LEARNERS, period):
        failures = trace if kw.pop("failures", False) else None
        config = SimConfig(
            model=spec["model"],
            model_size=spec["size"],
            data=None if spec["model"] == "vision" else data,
            seq_len=spec["seq_len"],
            learners=LEARNERS,
            tokens=spec["tokens"],
            seed=seed,
            reconfigure_seconds=reconfigure,
            inner=InnerConfig(
                batch_size=spec["batch"],
                warmup_steps=10 if spec["model"] != "vision" else 5,
                optimizer=optimizer or InnerConfig().optimizer,
            ),
            **({"failures": failures} if failures is not None else {}),
            **kw,
        )
        out.append((name, config))
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="tiny models and budgets: under 2 minutes")
    parser.add_argument("--json", action="store_true", help="end with one line of JSON holding every row")
    parser.add_argument(
        "--models", nargs="+", default=["gpt", "gpt-moe", "vision"], choices=["gpt", "gpt-moe", "vision"]
    )
    parser.add_argument("--data", default=str(DEFAULT_DATA), help="text for the language models")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--sync-every", type=int, default=24, help="H for the DiLoCo rows (16..32)")
    parser.add_argument(
        "--inner-optimizer",
        choices=INNER_OPTIMIZERS,
        default=InnerConfig().optimizer,
        help="every row's inner optimizer, at its own default lr (results files before 0.4 used adamw)",
    )
    parser.add_argument(
        "--reconfigure-seconds",
        type=float,
        default=10.0,
        help="elastic-ddp pause per membership change, in step times (default: the mean downtime)",
    )
    parser.add_argument(
        "--rows", nargs="+", default=None, metavar="NAME", help="only these rows (e.g. decoupled-hetero-k1 ddp)"
    )
    parser.add_argument("--out", type=Path, default=None, help="where to write the JSON table")
    parser.add_argument("--load", type=Path, default=None, help="print the table of a JSON file this wrote instead")
    parser.add_argument("--markdown", action="store_true", help="print the table as Markdown (docs/results.md)")
    args = parser.parse_args(argv)
    if args.load is not None:
        print_markdown(json.loads(args.load.read_text())["rows"])
        return 0
    if not Path(args.data).is_file():
        parser.error(f"--data {args.data} does not exist")
    known = [name for name, _ in rows(LEARNERS, args.sync_every)]
    unknown = sorted(set(args.rows or ()) - set(known))
    if unknown:
        parser.error(f"--rows: no row named {', '.join(unknown)}; the rows are {', '.join(known)}")
    out_path = args.out or ROOT / "benchmarks" / "results" / ("quality-quick.json" if args.quick else "quality.json")

    started = time.perf_counter()
    results = []
    for spec in plan(args.quick):
        if spec["model"] not in args.models:
            continue
        jobs = configs(spec, args.seed, args.data, args.sync_every, args.reconfigure_seconds, args.inner_optimizer)
        jobs = [(name, config) for name, config in jobs if args.rows is None or name in args.rows]
        task = build_task(jobs[0][1])
        for name, config in jobs:
            console.log(f"{spec['model']}: {name} ...")
            row = run_sim(config, task=task)
            row = {"name": name, **row}
            results.append(row)
            console.log(
                f"  eval_loss {row['eval_loss']:.4f} goodput {row['goodput']:.3f} uptime {row['uptime']:.3f} "
                f"({row['wall_seconds']:.1f} s)"
            )
    verdicts = judge(results)
    print_markdown(results) if args.markdown else print_table(results, verdicts)
    report = {
        "quick": args.quick,
        "seed": args.seed,
        "inner_optimizer": args.inner_optimizer,
        "wall_seconds": time.perf_counter() - started,
        "rows": results,
        "verdicts": verdicts,
    }
    out_path.parent.mkdir(parents=True, exist_ok=True)
    out_path.write_text(json.dumps(report, indent=1, sort_keys=True) + "\n")
    console.log(f"wrote {out_path}")
    if args.json:
        print(json.dumps(report, sort_keys=True))
    return 0


def judge(results: list[dict]) -> list[dict]:
    """The issue's aims, checked against what we measured (reported, never asserted)."""
    verdicts = []
    for model in dict.fromkeys(r["model"] for r in results):
        by = {r["name"]: r for r in results if r["model"] == model}
        if {"ddp", "decoupled-failures", "elastic-ddp-failures"} <= set(by):
            ratio = by["decoupled-failures"]["eval_loss"] / by["ddp"]["eval_loss"]
            verdicts.append(
                {
                    "model": model,
                    "aim": "decoupled-failures eval loss within 2 % of failure-free ddp",
                    "measured": f"ratio {ratio:.4f}",
                    "met": ratio <= 1.02,
                }
            )
            g = by["decoupled-failures"]["goodput"] / by["elastic-ddp-failures"]["goodput"]
            verdicts.append(
                {
                    "model": model,
                    "aim": "decoupled-failures goodput well above elastic-ddp-failures",
                    "measured": f"{by['decoupled-failures']['goodput']:.3f} vs "
                    f"{by['elastic-ddp-failures']['goodput']:.3f} (x{g:.2f})",
                    "met": g > 1.05,
                }
            )
        if {"decoupled-hetero-k1", "decoupled-hetero-k1-grace"} <= set(by):
            k1, grace = by["decoupled-hetero-k1"], by["decoupled-hetero-k1-grace"]
            verdicts.append(
                {
                    "model": model,
                    "aim": "hetero: K=1+grace at least as good as K=1",
                    "measured": f"eval_loss {grace['eval_loss']:.4f} vs {k1['eval_loss']:.4f}; "
                    f"utilization {grace['utilization']:.3f} vs {k1['utilization']:.3f}",
                    "met": grace["eval_loss"] <= k1["eval_loss"] * 1.002,
                }
            )
    return verdicts


def _cells(r: dict, ddp: dict[str, float]) -> list[str]:
    acc = r.get("eval_accuracy")
    per_merge = f"{r['contributions'] / r['outer_steps']:.2f}" if r["outer_steps"] else "–"
    return [
        r["model"],
        r["name"],
        f"{r['eval_loss']:.4f}",
        "" if acc is None else f"{acc:.3f}",
        f"{r['eval_loss'] / ddp[r['model']]:.3f}" if r["model"] in ddp else "",
        f"{r['goodput']:.3f}",
        f"{r['utilization']:.3f}",
        f"{r['uptime']:.3f}",
        f"{r['tokens_merged'] / r['tokens']:.3f}" if r.get("tokens") else "",
        str(r["outer_steps"]),
        per_merge,
        f"{r['sim_seconds']:.0f}",
        f"{r['wall_seconds']:.0f}",
    ]


def print_markdown(results: list[dict]) -> None:
    ddp = {r["model"]: r["eval_loss"] for r in results if r["name"] == "ddp"}
    print(
        "| model | configuration | eval loss | eval acc | loss vs ddp | goodput | utilization | uptime | merged tokens "
        "| merges | learners / merge | sim s | wall s |"
    )
    print("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for r in results:
        print("| " + " | ".join(_cells(r, ddp)) + " |")


def print_table(results: list[dict], verdicts: list[dict]) -> None:
    table = Table(title="Quality at equal tokens (virtual clock)")
    for col in (
        "model",
        "name",
        "eval loss",
        "eval acc",
        "vs ddp",
        "goodput",
        "utilization",
        "uptime",
        "merged tokens",
        "merges",
        "contrib/merge",
        "sim s",
        "wall s",
    ):
        table.add_column(col, justify="left" if col in ("model", "name") else "right")
    ddp = {r["model"]: r["eval_loss"] for r in results if r["name"] == "ddp"}
    for r in results:
        table.add_row(*_cells(r, ddp))
    Console(file=sys.stdout, width=200).print(table)
    for v in verdicts:
        mark = "met" if v["met"] else "NOT met"
        print(f"[{mark}] {v['model']}: {v['aim']}: {v['measured']}")


if __name__ == "__main__":
    raise SystemExit(main())
