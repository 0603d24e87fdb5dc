"""The gradient noise scale of the gap's models (issue #47, item 4): is the gap cells' global batch (16
sequences) below, near or above the batch beyond which data-parallel gains little from a larger one?

McCandlish et al. 2018 ("An Empirical Model of Large-Batch Training", arXiv 1812.06162) estimate the
critical batch B_crit by the simple noise scale B_simple = tr(Sigma) / |G|^2: the trace of the
per-sequence gradient covariance over the squared norm of the true gradient. The mean squared norm
S_B of gradients over batches of B sequences has E S_B = |G|^2 + tr(Sigma) / B, so two batch sizes give
unbiased estimates of both (their appendix A.1):

    |G|^2     = (B_big S_big - B_small S_small) / (B_big - B_small)
    tr(Sigma) = (S_small - S_big) / (1 / B_small - 1 / B_big)

Measured along data-parallel's own run, gap_why's (`gap_why.Study`: the scaling table's GPT at 20
tokens per parameter, global batch 16 sequences of 64 tokens, AdamW at its bracketed lr from the same
tuning file, `benchmarks/results/gap-why.tuning.json`), at 10 %, 50 % and 90 % of it, with B_small = 4
(one learner's batch at M = 4) and B_big = 64, K batches of each drawn from the whole corpus (rows the
run does not train on). B_simple is a ratio of two noisy estimates: per point it is taken from their
means over the seeds (`b_simple`), and per seed too (`per_seed`) for the spread.

McCandlish et al. find B_crit close to B_simple (within a small factor, B_simple the larger when the
Hessian is ill-conditioned); B_simple is the estimate measured here, not B_crit itself.

    python benchmarks/noise_scale.py --quick --json
    python benchmarks/noise_scale.py --out benchmarks/results/noise-scale.json --json   # 84k, 148k x 3 seeds
"""

from __future__ import annotations

import json
import statistics
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from gap_why import AT, FULL, QUICK, Study, parser, say  # noqa: E402

from ddiloco.train.tasks import LanguageModelTask  # noqa: E402

RESULTS = Path(__file__).resolve().parent / "results"
B_SMALL, B_BIG = 4, 64
K_SMALL, K_BIG = 128, 32  # batches of each size per point: 512 and 2048 sequences


def mean_squared_norm(task: LanguageModelTask, model: torch.nn.Module, batch: int, count: int, seed: int) -> float:
    """S_B: the mean over `count` batches of `batch` sequences of |gradient of the batch's mean loss|^2."""
    stream = task.stream(0, 1, batch, seed)
    params = [p for p in model.parameters() if p.requires_grad]
    total = 0.0
    for i in range(count):
        model.zero_grad(set_to_none=True)
        task.loss(model, stream.batch_at(i)).backward()
        total += sum(float(p.grad.pow(2).sum()) for p in params if p.grad is not None)
    model.zero_grad(set_to_none=True)
    return total / count


def estimates(s_small: float, s_big: float) -> tuple[float, float]:
    """(|G|^2, tr(Sigma)) from the mean squared norms at B_SMALL and B_BIG (McCandlish et al., A.1)."""
    g2 = (B_BIG * s_big - B_SMALL * s_small) / (B_BIG - B_SMALL)
    trace = (s_small - s_big) / (1 / B_SMALL - 1 / B_BIG)
    return g2, trace


def points(study: Study, size: str, seed: int, lr: float, k_small: int, k_big: int) -> list[dict]:
    """S_small and S_big at each of gap_why's points (AT) of data-parallel's run `seed`."""
    task, out = study.task(size), []

    def visit(model: torch.nn.Module, opt: torch.optim.Optimizer, step: int) -> None:
        at = round(step / study.total_steps(size), 2)
        rows = 10**8 + seed * 10**6 + step  # the probe's rows: drawn apart from the run's and the evals'
        s_small = mean_squared_norm(task, model, B_SMALL, k_small, rows)
        s_big = mean_squared_norm(task, model, B_BIG, k_big, rows + 1)
        g2, trace = estimates(s_small, s_big)
        out.append({"size": size, "seed": seed, "at": at, "s_small": s_small, "s_big": s_big, "g2": g2, "trace": trace})
        say(f"{size} seed {seed} at {at:.0%}: |G|^2 {g2:.4g}, tr(Sigma) {trace:.4g}, B_simple {trace / g2:.1f}")

    study.train(size, lr, seed, visit)
    return out


def summarize(cells: list[dict], seq_len: int) -> list[dict]:
    """Per size and point: B_simple from the seeds' mean estimates, in sequences and tokens, with each
    seed's own ratio."""
    groups: dict[tuple, list[dict]] = {}
    for c in cells:
        groups.setdefault((c["size"], c["at"]), []).append(c)
    rows = []
    for (size, at), cs in sorted(groups.items(), key=lambda kv: (int(kv[0][0].rstrip("k")), kv[0][1])):
        g2 = statistics.fmean(c["g2"] for c in cs)
        trace = statistics.fmean(c["trace"] for c in cs)
        per_seed = [c["trace"] / c["g2"] for c in sorted(cs, key=lambda c: c["seed"])]
        b = trace / g2
        rows.append(
            {
                "size": size,
                "at": at,
                "seeds": len(cs),
                "g2": g2,
                "trace": trace,
                "b_simple": b,
                "b_simple_tokens": b * seq_len,
                "per_seed": per_seed,
                "per_seed_sd": statistics.stdev(per_seed) if len(per_seed) > 1 else 0.0,
            }
        )
    return rows


def main(argv: list[str] | None = None) -> int:
    p = parser(__doc__)
    p.add_argument("--out", type=Path, default=None, help="results file: written as each run ends, resumed from")
    p.add_argument(
        "--tuning",
        type=Path,
        default=None,
        help="data-parallel's lr tuning, shared with gap_why (default: results/gap-why.tuning.json, or "
        "gap-why-OPTIMIZER.tuning.json with --inner-optimizer; --quick: none)",
    )
    args = p.parse_args(argv)
    cfg = dict(QUICK if args.quick else FULL)
    cfg["sizes"] = args.sizes or (cfg["sizes"] if args.quick else ["84k", "148k"])
    cfg["seeds"] = args.seeds or cfg["seeds"]
    k_small, k_big = (8, 4) if args.quick else (K_SMALL, K_BIG)
    if args.inner_optimizer != "adamw":  # (files made before the flag are AdamW's, without the key)
        cfg["inner_optimizer"] = args.inner_optimizer
    suffix = "" if args.inner_optimizer == "adamw" else f"-{args.inner_optimizer}"
    tuning = args.tuning or (None if args.quick else RESULTS / f"gap-why{suffix}.tuning.json")
    torch.set_num_threads(1)
    config = {
        k: cfg[k] for k in ("ratio", "seq_len", "batch", "eval_batches") + (("inner_optimizer",) if suffix else ())
    } | {
        "data": args.data,
        "b_small": B_SMALL,
        "b_big": B_BIG,
        "k_small": k_small,
        "k_big": k_big,
        "at": list(AT),
    }
    saved = json.loads(args.out.read_text()) if args.out and args.out.is_file() else {}
    cells: list[dict] = saved.get("cells", []) if saved.get("config") == config else []
    study = Study(cfg, args.data, tuning)
    lrs: dict[str, float] = {}
    for size in cfg["sizes"]:
        lrs[size] = study.tuned_lr(size)
        for seed in range(cfg["seeds"]):
            if any(c["size"] == size and c["seed"] == seed for c in cells):
                continue
            cells += points(study, size, seed, lrs[size], k_small, k_big)
            if args.out:
                tmp = args.out.with_suffix(".tmp")
                tmp.write_text(json.dumps({"config": config, "cells": cells}, indent=1))
                tmp.replace(args.out)
    wanted = [c for c in cells if c["size"] in cfg["sizes"] and c["seed"] < cfg["seeds"]]
    summary = summarize(wanted, cfg["seq_len"])
    for r in summary:
        say(
            f"{r['size']:>5} at {r['at']:.0%}: B_simple {r['b_simple']:.1f} sequences ({r['b_simple_tokens']:.0f} "
            f"tokens; per seed {', '.join(f'{b:.1f}' for b in r['per_seed'])}); the gap's global batch is "
            f"{cfg['batch']}, a learner's at M = 4 is {cfg['batch'] // 4}"
        )
    if args.json:
        print(json.dumps({"summary": summary, "cells": wanted, "config": config, "inner_lr": lrs}, sort_keys=True))
    return 0


if __name__ == "__main__":
    sys.exit(main())
