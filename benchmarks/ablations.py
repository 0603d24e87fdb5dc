"""The paper's ablations, reproduced in direction, on the virtual clock (real training, simulated time).

Each ablation changes one thing of the quality benchmark's Decoupled DiLoCo row (`quality.py`: the
same model, data, token budget, H = 24, P = 4, tau = 2, K = 1, grace 0.9) and keeps the rest:

    merge       RDA against plain averaging for M = 2, 4, 8, 16 at equal total tokens: the merged
                outer gradient's norm over the contributions' (a plain mean of nearly orthogonal
                updates keeps about 1/sqrt(M) of it) and the eval loss
    precision   outer gradients through the real wire codecs: fp32, bf16, int8, int4
    quorum      heterogeneous learners: K = 1, K = 1 + grace, K = M (quality.py's own rows)
    learners    M = 2, 4, 8 at equal total tokens (the merge ablation's RDA runs)
    period      H = 8, 24, 48
    fragments   P = 1, 4, 24: eval loss and the peak bytes a learner sends after one step
    distance    learners and synchronizer (or the all-reduce) 50 ms apart at 10 Gbit/s, 1 Gbit/s and
                100 Mbit/s (and 10 and 1 Mbit/s to find the edge), for Decoupled DiLoCo, synchronous
                DiLoCo and data-parallel: goodput and eval loss at equal tokens, and the least
                bandwidth at which each keeps 95 % of its goodput on a free, instant link

One seed; the figures show directions, not significance (see docs/results.md).

    python benchmarks/ablations.py --quick     # tiny model: about 3 minutes on 2 cores
    python benchmarks/ablations.py             # the default GPT: about 25 minutes
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import sys
import time
from pathlib import Path

from rich.console import Console
from rich.table import Table

sys.path.insert(0, str(Path(__file__).resolve().parent))
import quality  # noqa: E402 - the quality benchmark is the one source of the base rows

from ddiloco.sim.config import SimConfig  # noqa: E402
from ddiloco.sim.hardware import LinkModel  # noqa: E402
from ddiloco.sim.run import build_task, run_sim  # noqa: E402
from ddiloco.train.inner import INNER_OPTIMIZERS, InnerConfig, InnerOptimizer  # noqa: E402

console = Console(stderr=True)
ABLATIONS = ("merge", "precision", "quorum", "learners", "period", "fragments", "distance")
MBIT = 1e6 / 8  # bytes per second in one Mbit/s
DISTANT_LATENCY = 0.05
BANDWIDTHS_MBIT = (10_000.0, 1_000.0, 100.0, 10.0, 1.0)
FREE_LINK = LinkModel(latency=0.0, bandwidth=1e15, merge_rate=1e15)


def spec(quick: bool) -> dict:
    if quick:
        return dict(model="gpt", size="tiny", tokens=200_000, batch=8, seq_len=64)
    return dict(model="gpt", size="default", tokens=1_000_000, batch=8, seq_len=128)


def base_rows(spec_: dict, seed: int, data: str, optimizer: InnerOptimizer | None = None) -> dict[str, SimConfig]:
    return dict(quality.configs(dict(spec_), seed, data, period=24, reconfigure=10.0, optimizer=optimizer))


def plan(base: dict[str, SimConfig]) -> list[tuple[str, str, SimConfig]]:
    """(ablation, setting, config) for every row, in order."""
    d = base["decoupled"]
    alg = d.algorithm
    out: list[tuple[str, str, SimConfig]] = []
    for m in (2, 4, 8, 16):
        for merge in ("rda", "mean"):
            out.append(
                (
                    "merge",
                    f"M={m} {merge}",
                    dataclasses.replace(d, learners=m, algorithm=dataclasses.replace(alg, merge=merge)),
                )
            )
    for codec in ("fp32", "bf16", "int8", "int4"):
        out.append(("precision", codec, dataclasses.replace(d, codec=codec)))
    for name, setting in (
        ("decoupled-hetero-k1", "K=1"),
        ("decoupled-hetero-k1-grace", "K=1 + grace"),
        ("decoupled-hetero-km", "K=M"),
    ):
        out.append(("quorum", setting, base[name]))
    for m in (2, 4, 8):
        out.append(
            ("learners", f"M={m}", dataclasses.replace(d, learners=m, algorithm=dataclasses.replace(alg, merge="rda")))
        )
    for h in (8, 24, 48):
        out.append(("period", f"H={h}", dataclasses.replace(d, algorithm=dataclasses.replace(alg, sync_every=h))))
    for p in (1, 4, 24):
        out.append(("fragments", f"P={p}", dataclasses.replace(d, algorithm=dataclasses.replace(alg, fragments=p))))
    methods = {"decoupled": d, "diloco": base["diloco"], "ddp": base["ddp"]}
    for method, config in methods.items():
        out.append(("distance", f"{method} free link", dataclasses.replace(config, link=FREE_LINK)))
        for mbit in BANDWIDTHS_MBIT:
            link = LinkModel(latency=DISTANT_LATENCY, bandwidth=mbit * MBIT)
            out.append(("distance", f"{method} {mbit:g} Mbit/s", dataclasses.replace(config, link=link)))
    return out


FIGURES = (
    "eval_loss",
    "goodput",
    "utilization",
    "outer_norm_ratio",
    "learners_per_merge",
    "peak_step_bytes",
    "outer_steps",
    "sim_seconds",
    "wall_seconds",
)


def figures(result: dict) -> dict:
    out = {k: result.get(k) for k in FIGURES}
    merges = result.get("outer_steps") or 0
    out["learners_per_merge"] = result["contributions"] / merges if merges else None
    return out


def bandwidth_needed(rows: list[dict]) -> dict[str, float | None]:
    """Per method: the least Mbit/s (of those run, 50 ms away) keeping 95 % of its free-link goodput;
    None when even the fastest link run does not."""
    out: dict[str, float | None] = {}
    for method in ("decoupled", "diloco", "ddp"):
        mine = [r for r in rows if r["ablation"] == "distance" and r["setting"].startswith(method + " ")]
        free = next(r["goodput"] for r in mine if r["setting"].endswith("free link"))
        ok = [
            float(r["setting"].split()[1])
            for r in mine
            if not r["setting"].endswith("free link") and r["goodput"] >= 0.95 * free
        ]
        out[method] = min(ok) if ok else None
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="the tiny model and a small budget: about 3 minutes")
    parser.add_argument("--json", action="store_true", help="end with one line of JSON: {'rows': [...], ...}")
    parser.add_argument("--only", nargs="+", choices=ABLATIONS, default=list(ABLATIONS), help="run these ablations")
    parser.add_argument("--data", default=str(quality.DEFAULT_DATA), help="text for the language model")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--inner-optimizer",
        choices=INNER_OPTIMIZERS,
        default=InnerConfig().optimizer,
        help="every row's inner optimizer, at its own default lr (results files before 0.4 used adamw)",
    )
    parser.add_argument("--out", type=Path, default=None, help="where to write the JSON report")
    args = parser.parse_args(argv)
    if not Path(args.data).is_file():
        parser.error(f"--data {args.data} does not exist")
    out_path = args.out or quality.ROOT / "benchmarks" / "results" / (
        "ablations-quick.json" if args.quick else "ablations.json"
    )
    started = time.perf_counter()
    base = base_rows(spec(args.quick), args.seed, args.data, args.inner_optimizer)
    task = build_task(base["decoupled"])
    done: dict[str, dict] = {}  # one run per distinct configuration (the learners rows reuse the merge rows)
    rows = []
    for ablation, setting, config in plan(base):
        if ablation not in args.only:
            continue
        key = repr(config)
        if key not in done:
            console.log(f"{ablation}: {setting} ...")
            done[key] = figures(run_sim(config, task=task))
        rows.append({"ablation": ablation, "setting": setting, **done[key]})
    report = {
        "quick": args.quick,
        "seed": args.seed,
        "inner_optimizer": args.inner_optimizer,
        "model": spec(args.quick),
        "rows": rows,
        "wall_seconds": time.perf_counter() - started,
    }
    if "distance" in args.only:
        report["bandwidth_needed_mbit"] = bandwidth_needed(rows)
    print_table(rows, report.get("bandwidth_needed_mbit"))
    out_path.parent.mkdir(parents=True, exist_ok=True)
    out_path.write_text(json.dumps(report, indent=1, sort_keys=True) + "\n")
    console.log(f"wrote {out_path}")
    if args.json:
        print(json.dumps(report, sort_keys=True))
    return 0


def _fmt(value: object, digits: int = 4) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.{digits}f}" if abs(value) < 1e4 else f"{value:.3g}"
    return str(value)


def print_table(rows: list[dict], needed: dict | None) -> None:
    table = Table(title="Ablations (virtual clock, one seed)")
    for col in (
        "ablation",
        "setting",
        "eval loss",
        "goodput",
        "utilization",
        "|merged|/|contrib|",
        "learners/merge",
        "peak bytes/step",
        "merges",
        "wall s",
    ):
        table.add_column(col, justify="left" if col in ("ablation", "setting") else "right")
    for r in rows:
        table.add_row(
            r["ablation"],
            r["setting"],
            _fmt(r["eval_loss"]),
            _fmt(r["goodput"], 3),
            _fmt(r["utilization"], 3),
            _fmt(r["outer_norm_ratio"], 3),
            _fmt(r["learners_per_merge"], 2),
            _fmt(r["peak_step_bytes"]),
            _fmt(r["outer_steps"]),
            _fmt(r["wall_seconds"], 1),
        )
    Console(file=sys.stdout, width=200).print(table)
    if needed:
        for method, mbit in needed.items():
            text = (
                f"{mbit:g} Mbit/s"
                if mbit is not None and math.isfinite(mbit)
                else f"more than {BANDWIDTHS_MBIT[0]:g} Mbit/s"
            )
            print(f"{method}: least bandwidth (50 ms away) keeping 95 % of its free-link goodput: {text}")


if __name__ == "__main__":
    raise SystemExit(main())
