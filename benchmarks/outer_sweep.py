"""Which outer step? A seeded sweep on the virtual clock, next to `quality.py` (same models, data,
token budgets and learners), to choose the outer optimizer's defaults from evidence.

Groups (each configuration over every seed; the table shows mean +- std and the ratio to the best
data-parallel row of the same model, a tuned baseline):

    grid        outer lr {0.5, 0.7, 1.0} x momentum {0, 0.5, 0.9}, synchronous and Decoupled DiLoCo
    ddp-lr      data-parallel at inner lr {1.5e-3, 3e-3, 6e-3}: the baseline tuned, not assumed
    one-learner one learner, DiLoCo (lr 1 / momentum 0, and the old 0.7 / 0.9) against data-parallel:
                the outer step alone, without any averaging
    sync-every  synchronous DiLoCo at H {1, 6, 24} with the grid's best outer step (the defaults when the
                grid is not run); H = 1 is data-parallel with an outer Nesterov step on each step's average
    last-merge  the grid's momentum rows with the final merge taken without momentum (no end-of-run kick)
    arrival     Decoupled DiLoCo at the default outer step: overwrite against rebase (keeping in-flight
                work), with late work refused (the paper's) or merged, on identical learners, on
                heterogeneous ones with K = 1 and no grace, and the same behind a link of 0.3 s (step
                time 1 s), where many answers arrive after their round closed

    python benchmarks/outer_sweep.py --quick         # tiny models, 2 seeds, about 3 minutes
    python benchmarks/outer_sweep.py                 # default models, 3 seeds: about 70 minutes per core
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from dataclasses import replace
from pathlib import Path

import torch
from rich.console import Console
from rich.table import Table

sys.path.insert(0, str(Path(__file__).resolve().parent))
from quality import DEFAULT_DATA, LEARNERS, ROOT, plan  # noqa: E402

from ddiloco.core import AlgorithmConfig  # noqa: E402
from ddiloco.sim.config import SimConfig  # noqa: E402
from ddiloco.sim.hardware import LinkModel, StepTimeModel, half_slow  # noqa: E402
from ddiloco.sim.run import build_task, run_sim  # noqa: E402
from ddiloco.train.inner import DEFAULT_LR, INNER_OPTIMIZERS, InnerConfig, InnerOptimizer  # noqa: E402

console = Console(stderr=True)
LRS, MOMENTA = (0.5, 0.7, 1.0), (0.0, 0.5, 0.9)
DDP_LR_FACTORS = (0.5, 1.0, 2.0)  # data-parallel's inner lrs: these times the optimizer's default lr
GROUPS = ("grid", "ddp-lr", "one-learner", "sync-every", "last-merge", "arrival")
HETERO = StepTimeModel(speeds=half_slow(4, 1.2), jitter=0.1)  # quality.py's heterogeneous learners


def default_ddp_lrs(optimizer: InnerOptimizer) -> tuple[float, ...]:
    """Data-parallel's inner lrs around `optimizer`'s default (AdamW: 1.5e-3, 3e-3, 6e-3)."""
    return tuple(f * DEFAULT_LR[optimizer] for f in DDP_LR_FACTORS)


def base_config(spec: dict, seed: int, data: str, optimizer: InnerOptimizer | None = None, **kw) -> SimConfig:
    """A run of `spec`; `optimizer`: the inner optimizer (None: the package's default), at its default lr."""
    optimizer = optimizer or InnerConfig().optimizer
    inner = InnerConfig(
        batch_size=spec["batch"],
        warmup_steps=10 if spec["model"] != "vision" else 5,
        optimizer=optimizer,
        lr=kw.pop("inner_lr", DEFAULT_LR[optimizer]),
    )
    return SimConfig(
        model=spec["model"],
        model_size=spec["size"],
        data=None if spec["model"] == "vision" else data,
        seq_len=spec["seq_len"],
        learners=kw.pop("learners", LEARNERS),
        tokens=spec["tokens"],
        seed=seed,
        inner=inner,
        **kw,
    )


def algorithm(method: str, lr: float, momentum: float, period: int) -> AlgorithmConfig:
    if method == "diloco":
        return AlgorithmConfig(
            fragments=1,
            sync_every=period,
            overlap=0,
            quorum=LEARNERS,
            grace=0.0,
            merge="mean",
            outer_lr=lr,
            outer_momentum=momentum,
        )
    return AlgorithmConfig(
        fragments=4, sync_every=period, overlap=2, quorum=1, grace=0.9, outer_lr=lr, outer_momentum=momentum
    )


def jobs(
    groups: list[str],
    spec: dict,
    seeds: list[int],
    data: str,
    period: int,
    best: tuple[float, float],
    lrs: tuple[float, ...] = LRS,
    momenta: tuple[float, ...] = MOMENTA,
    methods: tuple[str, ...] = ("diloco", "decoupled"),
    ddp_lrs: tuple[float, ...] | None = None,
    optimizer: InnerOptimizer | None = None,
) -> list[tuple[dict, SimConfig]]:
    """(label, config) for every run of these groups; `best`: (lr, momentum) for sync-every;
    `optimizer`: None for the package's default; `ddp_lrs`: None for `default_ddp_lrs(optimizer)`."""
    optimizer = optimizer or InnerConfig().optimizer
    ddp_lrs = ddp_lrs or default_ddp_lrs(optimizer)
    out = []
    for seed in seeds:

        def add(label: dict, config: SimConfig) -> None:
            out.append(({**label, "model": spec["model"], "seed": seed}, config))  # noqa: B023 (called in this iteration)

        if "grid" in groups:
            for method in methods:
                for lr in lrs:
                    for mu in momenta:
                        add(
                            {"group": "grid", "method": method, "outer_lr": lr, "outer_momentum": mu},
                            base_config(
                                spec, seed, data, optimizer, method=method, algorithm=algorithm(method, lr, mu, period)
                            ),
                        )
        if "ddp-lr" in groups:
            for inner_lr in ddp_lrs:
                add(
                    {"group": "ddp-lr", "method": "ddp", "inner_lr": inner_lr},
                    base_config(spec, seed, data, optimizer=optimizer, method="ddp", inner_lr=inner_lr),
                )
        if "one-learner" in groups:
            add(
                {"group": "one-learner", "method": "ddp"},
                base_config(spec, seed, data, optimizer=optimizer, method="ddp", learners=1),
            )
            for lr, mu in ((1.0, 0.0), (0.7, 0.9)):
                alg = replace(algorithm("diloco", lr, mu, period), quorum=1)
                add(
                    {"group": "one-learner", "method": "diloco", "outer_lr": lr, "outer_momentum": mu},
                    base_config(spec, seed, data, optimizer=optimizer, method="diloco", learners=1, algorithm=alg),
                )
        if "sync-every" in groups:
            for h in (1, 6, 24):
                add(
                    {
                        "group": "sync-every",
                        "method": "diloco",
                        "sync_every": h,
                        "outer_lr": best[0],
                        "outer_momentum": best[1],
                    },
                    base_config(
                        spec, seed, data, optimizer=optimizer, method="diloco", algorithm=algorithm("diloco", *best, h)
                    ),
                )
        if "last-merge" in groups:
            for method in ("diloco", "decoupled"):
                for mu in (0.5, 0.9):
                    alg = replace(algorithm(method, 0.7, mu, period), final_momentum=False)
                    add(
                        {"group": "last-merge", "method": method, "outer_lr": 0.7, "outer_momentum": mu},
                        base_config(spec, seed, data, optimizer=optimizer, method=method, algorithm=alg),
                    )
        if "arrival" in groups:
            defaults = AlgorithmConfig()
            for setting in ("", " hetero K=1", " hetero K=1 slow link"):
                for arrival, late in (
                    ("overwrite", "refuse"),
                    ("rebase", "refuse"),
                    ("overwrite", "merge"),
                    ("rebase", "merge"),
                ):
                    alg = replace(
                        algorithm("decoupled", defaults.outer_lr, defaults.outer_momentum, period),
                        arrival=arrival,
                        late=late,
                    )
                    kw = {}
                    if setting:  # no grace: answers that come after the opener's merge are stale
                        alg = replace(alg, quorum=1, grace=0.0)
                        kw["steps"] = HETERO
                    if "slow link" in setting:  # 0.3 s each way: many answers are refused as stale
                        kw["link"] = LinkModel(latency=0.3)
                    add(
                        {
                            "group": "arrival",
                            "method": f"decoupled-{arrival}-{late}{setting}",
                            "outer_lr": defaults.outer_lr,
                            "outer_momentum": defaults.outer_momentum,
                        },
                        base_config(spec, seed, data, optimizer=optimizer, method="decoupled", algorithm=alg, **kw),
                    )
    return out


def summarize(rows: list[dict]) -> list[dict]:
    """Mean and spread over seeds of each configuration, and the ratio to the best data-parallel mean."""
    keys = ("model", "group", "method", "outer_lr", "outer_momentum", "inner_lr", "sync_every")
    groups: dict[tuple, list[dict]] = {}
    for r in rows:
        groups.setdefault(tuple(r.get(k) for k in keys), []).append(r)
    out = []
    for key, runs in groups.items():
        losses = [r["eval_loss"] for r in runs]
        out.append(
            {
                **dict(zip(keys, key, strict=True)),
                "seeds": len(runs),
                "eval_loss": statistics.fmean(losses),
                "eval_loss_std": statistics.stdev(losses) if len(losses) > 1 else 0.0,
                "goodput": statistics.fmean(r["goodput"] for r in runs),
                "merged_share": statistics.fmean(r["merged_share"] for r in runs)
                if all("merged_share" in r for r in runs)
                else None,
            }
        )
    for model in {s["model"] for s in out}:
        ddp = [s["eval_loss"] for s in out if s["model"] == model and s["group"] == "ddp-lr"]
        for s in out:
            if s["model"] == model and ddp:
                s["vs_tuned_ddp"] = s["eval_loss"] / min(ddp)
    return out


def best_outer(summary: list[dict], model: str) -> dict[str, tuple[float, float]]:
    """Per method, the grid's (lr, momentum) with the lowest mean eval loss."""
    best = {}
    for method in ("diloco", "decoupled"):
        cands = [s for s in summary if s["model"] == model and s["group"] == "grid" and s["method"] == method]
        if cands:
            top = min(cands, key=lambda s: s["eval_loss"])
            best[method] = (top["outer_lr"], top["outer_momentum"])
    return best


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="tiny models, seeds 0 and 1")
    parser.add_argument("--json", action="store_true", help="end with one line of JSON")
    parser.add_argument("--models", nargs="+", default=["gpt", "vision"], choices=["gpt", "gpt-moe", "vision"])
    parser.add_argument("--groups", nargs="+", default=list(GROUPS), choices=GROUPS)
    parser.add_argument("--seeds", nargs="+", type=int, default=None)
    parser.add_argument("--sync-every", type=int, default=24)
    parser.add_argument("--lrs", nargs="+", type=float, default=list(LRS), help="the grid's outer learning rates")
    parser.add_argument("--momenta", nargs="+", type=float, default=list(MOMENTA), help="the grid's outer momenta")
    parser.add_argument("--methods", nargs="+", default=["diloco", "decoupled"], choices=["diloco", "decoupled"])
    parser.add_argument(
        "--ddp-lrs",
        nargs="+",
        type=float,
        default=None,
        help="data-parallel inner lrs (default: 0.5, 1, 2 x the optimizer's default lr)",
    )
    parser.add_argument(
        "--inner-optimizer",
        choices=INNER_OPTIMIZERS,
        default=InnerConfig().optimizer,
        help="every run's inner optimizer, at its own default lr (results files before 0.4 used adamw)",
    )
    parser.add_argument("--threads", type=int, default=1, help="torch threads (the sweep runs one sim at a time)")
    parser.add_argument("--data", default=str(DEFAULT_DATA))
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument(
        "--load",
        nargs="+",
        type=Path,
        default=None,
        help="summarize these result files (from runs split over processes) instead of running",
    )
    parser.add_argument("--markdown", action="store_true", help="print the summary as a Markdown table")
    args = parser.parse_args(argv)
    if args.load:
        rows = [r for path in args.load for r in json.loads(path.read_text())["rows"]]
        summary = summarize(rows)
        (print_markdown if args.markdown else print_table)(summary)
        if args.json:
            print(
                json.dumps(
                    {"summary": summary, "best": {m: best_outer(summary, m) for m in {r["model"] for r in rows}}},
                    sort_keys=True,
                )
            )
        return 0
    torch.set_num_threads(args.threads)
    seeds = args.seeds or ([0, 1] if args.quick else [0, 1, 2])
    out_path = args.out or ROOT / "benchmarks" / "results" / (
        "outer-sweep-quick.json" if args.quick else "outer-sweep.json"
    )
    started = time.perf_counter()
    rows: list[dict] = []
    for spec in plan(args.quick):
        if spec["model"] not in args.models:
            continue
        first = [g for g in args.groups if g != "sync-every"]
        todo = jobs(
            first,
            spec,
            seeds,
            args.data,
            args.sync_every,
            (1.0, 0.0),
            tuple(args.lrs),
            tuple(args.momenta),
            tuple(args.methods),
            tuple(args.ddp_lrs) if args.ddp_lrs else None,
            args.inner_optimizer,
        )
        task = build_task(todo[0][1]) if todo else None
        for i, (label, config) in enumerate(todo):
            rows.append(run_one(label, config, task, i, len(todo)))
        if "sync-every" in args.groups:
            defaults = AlgorithmConfig()
            best = best_outer(summarize(rows), spec["model"]).get(
                "diloco", (defaults.outer_lr, defaults.outer_momentum)
            )
            later = jobs(["sync-every"], spec, seeds, args.data, args.sync_every, best, optimizer=args.inner_optimizer)
            task = task or build_task(later[0][1])
            for i, (label, config) in enumerate(later):
                rows.append(run_one(label, config, task, i, len(later)))
        _write(out_path, args, seeds, rows, started)  # after each model: a long sweep keeps what it has
    summary = summarize(rows)
    (print_markdown if args.markdown else print_table)(summary)
    report = _write(out_path, args, seeds, rows, started)
    console.log(f"wrote {out_path}")
    if args.json:
        print(json.dumps({"summary": summary, "best": report["best"]}, sort_keys=True))
    return 0


def run_one(label: dict, config: SimConfig, task, i: int, n: int) -> dict:  # noqa: ANN001
    row = run_sim(config, task=task)
    console.log(
        f"[{i + 1}/{n}] {label}: eval_loss {row['eval_loss']:.4f} goodput {row['goodput']:.3f} "
        f"({row['wall_seconds']:.1f} s)"
    )
    return {
        **label,
        "eval_loss": row["eval_loss"],
        "goodput": row["goodput"],
        "outer_steps": row["outer_steps"],
        "merged_share": row.get("tokens_merged", row.get("tokens", 0)) / row["tokens"] if row.get("tokens") else 1.0,
        "rejected": row.get("rejected_contributions", 0),
        "wall_seconds": row["wall_seconds"],
    }


def _write(path: Path, args: argparse.Namespace, seeds: list[int], rows: list[dict], started: float) -> dict:
    summary = summarize(rows)
    report = {
        "quick": args.quick,
        "seeds": seeds,
        "sync_every": args.sync_every,
        "inner_optimizer": args.inner_optimizer,
        "rows": rows,
        "summary": summary,
        "best": {m: best_outer(summary, m) for m in {r["model"] for r in rows}},
        "wall_seconds": time.perf_counter() - started,
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(report, indent=1, sort_keys=True) + "\n")
    return report


def print_table(summary: list[dict]) -> None:
    table = Table(title="Outer-step sweep (virtual clock, mean over seeds)")
    for col in (
        "model",
        "group",
        "method",
        "outer lr",
        "momentum",
        "H",
        "inner lr",
        "eval loss",
        "std",
        "vs tuned ddp",
        "goodput",
    ):
        table.add_column(col, justify="left" if col in ("model", "group", "method") else "right")
    fmt = lambda v, f: "" if v is None else format(v, f)  # noqa: E731
    for s in summary:
        table.add_row(
            s["model"],
            s["group"],
            s["method"],
            fmt(s["outer_lr"], "g"),
            fmt(s["outer_momentum"], "g"),
            fmt(s["sync_every"], "d"),
            fmt(s["inner_lr"], "g"),
            f"{s['eval_loss']:.4f}",
            f"{s['eval_loss_std']:.4f}",
            fmt(s.get("vs_tuned_ddp"), ".3f"),
            f"{s['goodput']:.3f}",
        )
    Console(file=sys.stdout, width=200).print(table)


def print_markdown(summary: list[dict]) -> None:
    print(
        "| model | group | method | outer lr | momentum | H | inner lr | seeds | eval loss (mean ± std) | vs tuned ddp "
        "| goodput | merged tokens |"
    )
    print("|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    fmt = lambda v, f: "" if v is None else format(v, f)  # noqa: E731
    order = {g: i for i, g in enumerate(GROUPS)}
    for s in sorted(summary, key=lambda s: (s["model"], order.get(s["group"], 9), s["method"], s["eval_loss"])):
        spread = f" ± {s['eval_loss_std']:.4f}" if s["seeds"] > 1 else ""
        print(
            f"| {s['model']} | {s['group']} | {s['method']} | {fmt(s['outer_lr'], 'g')} | "
            f"{fmt(s['outer_momentum'], 'g')} | {fmt(s['sync_every'], 'd')} | {fmt(s['inner_lr'], 'g')} | "
            f"{s['seeds']} | {s['eval_loss']:.4f}{spread} | "
            f"{fmt(s.get('vs_tuned_ddp'), '.3f')} | "
            f"{s['goodput']:.3f} | {fmt(s.get('merged_share'), '.3f')} |"
        )


if __name__ == "__main__":
    raise SystemExit(main())
