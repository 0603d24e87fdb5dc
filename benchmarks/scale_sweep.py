"""Does the gap to data-parallel close with the token budget and the model size? A seeded sweep on the
virtual clock, next to `quality.py` and `outer_sweep.py` (same data, learners and defaults).

Each cell trains data-parallel, synchronous DiLoCo (P = 1, K = M) and Decoupled DiLoCo (P = 4, H = 24,
tau = 2, K = 1, gamma = 0.9) with the default outer step (lr 0.7, momentum 0.5) for `budget` times the
quality benchmark's token budget (1.5M tokens; the inner cosine spans the whole budget), and reports
the eval loss over data-parallel's at the same size and budget.

    python benchmarks/scale_sweep.py --quick --json                    # tiny GPT, budgets 1 and 2: 2 minutes
    python benchmarks/scale_sweep.py --sizes tiny default --budgets 1 2 4 --out a.json
    python benchmarks/scale_sweep.py --sizes 2m --budgets 1 --out b.json
    python benchmarks/scale_sweep.py --load a.json b.json --markdown   # one table of both
"""

from __future__ import annotations

import argparse
import functools
import json
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from outer_sweep import algorithm, base_config, run_one  # noqa: E402
from quality import DEFAULT_DATA, ROOT  # noqa: E402

from ddiloco.core import AlgorithmConfig  # noqa: E402
from ddiloco.sim.run import build_task  # noqa: E402
from ddiloco.train.gpt import GPT  # noqa: E402
from ddiloco.train.tasks import gpt_config  # noqa: E402

METHODS = ("ddp", "diloco", "decoupled")
BASE_TOKENS, QUICK_TOKENS = 1_500_000, 120_000


def spec(size: str, budget: float, quick: bool) -> dict:
    tokens = int((QUICK_TOKENS if quick else BASE_TOKENS) * budget)
    return dict(model="gpt", size=size, tokens=tokens, batch=8 if quick else 16, seq_len=64 if quick else 128)


@functools.cache
def parameters(size: str) -> int:
    """Dense GPT parameters at this size (byte vocab); counted on the meta device, nothing allocated."""
    with torch.device("meta"):
        return sum(p.numel() for p in GPT(gpt_config("gpt", size)).parameters())


def jobs(sizes: list[str], budgets: list[float], methods: list[str], seeds: list[int], data: str, quick: bool):
    defaults = AlgorithmConfig()
    for size in sizes:
        for budget in budgets:
            s = spec(size, budget, quick)
            for seed in seeds:
                for method in methods:
                    alg = None if method == "ddp" else algorithm(method, defaults.outer_lr, defaults.outer_momentum, 24)
                    label = {
                        "model": "gpt",
                        "size": size,
                        "budget": budget,
                        "tokens": s["tokens"],
                        "method": method,
                        "seed": seed,
                    }
                    yield label, base_config(s, seed, data, method=method, **({"algorithm": alg} if alg else {}))


def summarize(rows: list[dict]) -> list[dict]:
    """Mean over seeds per (size, budget, method), and the ratio to data-parallel's mean in the same cell."""
    cells: dict[tuple, list[dict]] = {}
    for r in rows:
        cells.setdefault((r["size"], r["budget"], r["method"]), []).append(r)
    out = []
    for (size, budget, method), runs in cells.items():
        losses = [r["eval_loss"] for r in runs]
        out.append(
            {
                "size": size,
                "params": runs[0].get("params"),
                "budget": budget,
                "tokens": runs[0]["tokens"],
                "method": method,
                "seeds": len(runs),
                "eval_loss": statistics.fmean(losses),
                "eval_loss_std": statistics.stdev(losses) if len(losses) > 1 else 0.0,
                "goodput": statistics.fmean(r["goodput"] for r in runs),
            }
        )
    ddp = {(s["size"], s["budget"]): s["eval_loss"] for s in out if s["method"] == "ddp"}
    for s in out:
        if (s["size"], s["budget"]) in ddp:
            s["vs_ddp"] = s["eval_loss"] / ddp[(s["size"], s["budget"])]
    order = {m: i for i, m in enumerate(METHODS)}
    return sorted(out, key=lambda s: (s["params"] or 0, s["budget"], order.get(s["method"], 9)))


def print_markdown(summary: list[dict]) -> None:
    print("| size | params | budget | tokens | method | seeds | eval loss | vs ddp | goodput |")
    print("|---|---:|---:|---:|---|---:|---:|---:|---:|")
    for s in summary:
        spread = f" ± {s['eval_loss_std']:.4f}" if s["seeds"] > 1 else ""
        ratio = f"{s['vs_ddp']:.3f}" if "vs_ddp" in s else ""
        print(
            f"| {s['size']} | {s['params'] or 0:,} | {s['budget']:g}× | {s['tokens']:,} | {s['method']} | "
            f"{s['seeds']} | {s['eval_loss']:.4f}{spread} | {ratio} | {s['goodput']:.3f} |"
        )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="the tiny GPT at budgets 1 and 2 of 120k tokens")
    parser.add_argument("--json", action="store_true", help="end with one line of JSON")
    parser.add_argument("--sizes", nargs="+", default=None, help="GPT sizes (train.tasks.MODEL_SIZES)")
    parser.add_argument("--budgets", nargs="+", type=float, default=None, help="multiples of the token budget")
    parser.add_argument("--methods", nargs="+", default=list(METHODS), choices=METHODS)
    parser.add_argument("--seeds", nargs="+", type=int, default=[0])
    parser.add_argument("--threads", type=int, default=1, help="torch threads (one sim at a time)")
    parser.add_argument("--data", default=str(DEFAULT_DATA))
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument("--load", nargs="+", type=Path, default=None, help="summarize these result files instead")
    parser.add_argument("--markdown", action="store_true", help="print the summary as a Markdown table")
    args = parser.parse_args(argv)
    if args.load:
        rows = [r for path in args.load for r in json.loads(path.read_text())["rows"]]
    else:
        if not Path(args.data).is_file():
            parser.error(f"--data {args.data} does not exist")
        for size in args.sizes or []:
            gpt_config("gpt", size)  # an unknown size fails here, not after an hour
        torch.set_num_threads(args.threads)
        sizes = args.sizes or (["tiny"] if args.quick else ["tiny", "default"])
        budgets = args.budgets or ([1.0, 2.0] if args.quick else [1.0, 2.0, 4.0])
        out = args.out or ROOT / "benchmarks" / "results" / (
            "scale-sweep-quick.json" if args.quick else "scale-sweep.json"
        )
        rows = run(sizes, budgets, args, out)
    summary = summarize(rows)
    print_markdown(summary)
    if args.json:
        print(json.dumps({"summary": summary}, sort_keys=True))
    return 0


def run(sizes: list[str], budgets: list[float], args: argparse.Namespace, out: Path) -> list[dict]:
    started, rows, tasks = time.perf_counter(), [], {}
    todo = list(jobs(sizes, budgets, args.methods, args.seeds, args.data, args.quick))
    for i, (label, config) in enumerate(todo):
        task = tasks.get(label["size"]) or tasks.setdefault(label["size"], build_task(config))
        rows.append({**run_one(label, config, task, i, len(todo)), "params": parameters(label["size"])})
        out.parent.mkdir(parents=True, exist_ok=True)  # after every run: a long sweep keeps what it has
        out.write_text(
            json.dumps(
                {
                    "quick": args.quick,
                    "rows": rows,
                    "summary": summarize(rows),
                    "wall_seconds": time.perf_counter() - started,
                },
                indent=1,
                sort_keys=True,
            )
            + "\n"
        )
    return rows


if __name__ == "__main__":
    raise SystemExit(main())
