"""The critical batch size of the gap's models, measured as McCandlish et al. define it (issue #47, item
4): the batch at which data-parallel training trades steps for tokens evenly.

McCandlish et al. 2018 ("An Empirical Model of Large-Batch Training", arXiv 1812.06162, section 2.3)
find that the steps S and the training tokens E that data-parallel needs to reach a given loss, over
batch sizes B, follow

    (S / S_min - 1) (E / E_min - 1) = 1,   i.e.   S(B) = S_min (1 + B_crit / B),   B_crit = E_min / S_min

(E in sequences). So S is linear in 1/B: a least-squares line through (1/B, S) has intercept S_min and
slope S_min B_crit. Below B_crit a larger batch saves steps almost for free; above it, it costs tokens.
`noise_scale.py` estimates B_crit from gradient statistics (B_simple); this measures it directly.

For each batch size B (4 to 128 sequences of 64 tokens: a learner's batch at M = 4 up to the noise
scale late in the run) data-parallel trains the gap cells' GPT (one process, global batch B: what DDP
computes) with the inner lr constant after its warm-up (no decay: the tokens to a loss do not depend
on a schedule's length), evaluated every `eval_tokens` tokens on the same validation batches, until it
reaches the lowest target loss or the token cap. The lr is bracketed per batch size on seed 0 by the
fair-race tuner (`tuning.Tuner`) on the tokens to the middle target (fewer is better, never reached is
the worst); S at each target is then the chosen lr's run, for every seed. Every run is saved as it
ends and resumed.

    python benchmarks/critical_batch.py --quick --json
    python benchmarks/critical_batch.py --out benchmarks/results/critical-batch-muon.json --json   # 84k, Muon
    python benchmarks/critical_batch.py --inner-optimizer adamw --out benchmarks/results/critical-batch-adamw.json
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import statistics
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from gap_why import Study, say  # noqa: E402
from scaling import parameters  # noqa: E402
from tuning import INNER_LR, Tuner, clean  # noqa: E402

from ddiloco.train.inner import DEFAULT_LR, INNER_OPTIMIZERS, inner_step, lr_at, make_inner_optimizer, set_lr  # noqa: E402

FULL = dict(
    size="84k",
    seq_len=64,
    batches=[4, 8, 16, 32, 64, 128],
    eval_batches=10,
    eval_tokens=65536,
    cap_ratio=60.0,  # tokens per parameter at most: three times the gap cells' budget
    seeds=3,
    targets={"muon": [2.2, 2.0, 1.9], "adamw": [2.4, 2.2, 2.05]},
)
QUICK = dict(
    size="12k",
    seq_len=32,
    batches=[2, 4, 8, 16],
    eval_batches=4,
    eval_tokens=4096,
    cap_ratio=30.0,
    seeds=1,
    targets={"muon": [3.0, 2.8, 2.7], "adamw": [3.0, 2.8, 2.7]},
)
GAP_BATCH = 16  # the gap cells' global batch (a learner's at M = 4: a quarter of it)


def crossing(points: list[list[float]], target: float) -> float | None:
    """The tokens at which a loss curve [(tokens, loss), ...] first reaches `target`, linear between the
    evaluation before and the first at or below it; None if it never does."""
    for i, (tokens, loss) in enumerate(points):
        if loss <= target:
            if i == 0:
                return tokens
            t0, l0 = points[i - 1]
            return t0 + (tokens - t0) * (l0 - target) / (l0 - loss)
    return None


def fit(batches: list[int], steps: list[float]) -> dict:
    """S = S_min + S_min B_crit / B by least squares in 1/B: S_min, B_crit and E_min (sequences); the
    line's R^2 says how well the relation holds."""
    x = [1 / b for b in batches]
    mx, my = statistics.fmean(x), statistics.fmean(steps)
    sxx = sum((xi - mx) ** 2 for xi in x)
    slope = sum((xi - mx) * (yi - my) for xi, yi in zip(x, steps, strict=True)) / sxx
    intercept = my - slope * mx
    total = sum((yi - my) ** 2 for yi in steps)
    residual = sum((yi - intercept - slope * xi) ** 2 for xi, yi in zip(x, steps, strict=True))
    r2 = 1 - residual / total if total > 0 else 1.0
    if intercept <= 0:  # no floor in the steps: the batches measured are all far below B_crit
        return {"s_min": intercept, "b_crit": math.inf, "e_min": slope, "r2": r2}
    return {"s_min": intercept, "b_crit": slope / intercept, "e_min": slope, "r2": r2}


class Curves:
    """Data-parallel's loss curves, one per (batch, lr, seed), saved to `path` as each one ends."""

    def __init__(self, cfg: dict, optimizer: str, data: str | None, path: Path | None) -> None:
        self.cfg, self.path = cfg, path
        study_cfg = {"ratio": 20.0, "seq_len": cfg["seq_len"], "batch": GAP_BATCH, "eval_batches": cfg["eval_batches"]}
        if optimizer != "adamw":
            study_cfg["inner_optimizer"] = optimizer
        self.study = Study(study_cfg, data, None)
        self.optimizer = optimizer
        self.config = {k: cfg[k] for k in ("size", "seq_len", "eval_batches", "eval_tokens", "cap_ratio")} | {
            "targets": self.targets,
            "data": data,
            "inner_optimizer": optimizer,
        }
        saved = json.loads(path.read_text()) if path is not None and path.is_file() else {}
        self.runs: list[dict] = saved.get("runs", []) if saved.get("config") == self.config else []

    @property
    def targets(self) -> list[float]:
        return self.cfg["targets"][self.optimizer]

    def curve(self, batch: int, lr: float, seed: int) -> dict:
        """The run's record: its evaluations [(tokens, loss)] and the tokens to each target."""
        for r in self.runs:
            if (r["batch"], r["lr"], r["seed"]) == (batch, lr, seed):
                return r
        run = self._train(batch, lr, seed)
        self.runs.append(run)
        if self.path is not None:
            tmp = self.path.with_suffix(".tmp")
            tmp.write_text(json.dumps({"config": self.config, "runs": self.runs}, indent=1))
            tmp.replace(self.path)
        return run

    def _train(self, batch: int, lr: float, seed: int) -> dict:
        cfg, size = self.cfg, self.cfg["size"]
        task = self.study.task(size)
        inner = dataclasses.replace(self.study.inner(lr), batch_size=batch)
        model = task.build_model(seed)
        opt = make_inner_optimizer(model, inner)
        stream = task.stream(0, 1, batch, seed)
        per_step = batch * cfg["seq_len"]
        cap = cfg["cap_ratio"] * parameters(size, cfg["seq_len"])
        every = max(1, round(cfg["eval_tokens"] / per_step))
        lowest = min(self.targets)
        points: list[list[float]] = []
        step = 0
        while step * per_step < cap:
            set_lr(opt, lr_at(inner, step, 0.0))  # warm-up, then constant
            loss = inner_step(model, opt, task.loss(model, stream.batch_at(step)), inner.grad_clip)
            step += 1
            if step % every == 0 or step * per_step >= cap:
                points.append([step * per_step, task.evaluate(model, max_batches=cfg["eval_batches"])["eval_loss"]])
                if points[-1][1] <= lowest or not math.isfinite(loss):
                    break
        reached = {str(t): crossing(points, t) for t in self.targets}
        say(
            f"{size} batch {batch} lr {lr:g} seed {seed}: {step} steps, loss {points[-1][1]:.4f}; tokens to "
            + ", ".join(f"{t}: {'-' if v is None else f'{v / 1e6:.3f}M'}" for t, v in reached.items())
        )
        return {"batch": batch, "lr": lr, "seed": seed, "steps": step, "points": points, "reached": reached}


def measure(curves: Curves, tuning: Path | None, seeds: int) -> dict:
    """Every batch size's lr bracketed on seed 0 (tokens to the middle target), then its runs at every
    seed; per target, S at each batch and the fit, over the seeds' mean S and per seed."""
    cfg, targets = curves.cfg, curves.targets
    middle = str(sorted(targets)[len(targets) // 2])

    def objective(label: str, settings: dict[str, float]) -> float:
        run = curves.curve(int(label.split("b")[-1]), settings["inner_lr"], int(settings["seed"]))
        return run["reached"][middle] if run["reached"][middle] is not None else math.inf

    context = curves.config | {"objective": f"tokens to {middle}"}
    tuner = Tuner(objective, tuning, context, say=lambda line: say(line.replace("eval loss", f"tokens to {middle}")))
    lrs: dict[int, dict] = {}
    for batch in cfg["batches"]:
        # centred where the square-root rule puts it from the optimizer's default at batch 16
        start = dataclasses.replace(
            INNER_LR, default=clean(DEFAULT_LR[curves.optimizer] * math.sqrt(batch / GAP_BATCH))
        )
        r = tuner.tune(f"{cfg['size']}-b{batch}", (start,), fixed={"seed": 0.0})
        lrs[batch] = {
            "lr": r["chosen"]["inner_lr"],
            "grid": r["grid"]["inner_lr"],
            "bracketed": r["bracketed"]["inner_lr"],
        }
    per_target = []
    for target in targets:
        steps: dict[int, list[float | None]] = {}
        for batch in cfg["batches"]:
            for seed in range(seeds):
                tokens = curves.curve(batch, lrs[batch]["lr"], seed)["reached"][str(target)]
                steps.setdefault(batch, []).append(None if tokens is None else tokens / (batch * cfg["seq_len"]))
        reached = [b for b in cfg["batches"] if all(s is not None for s in steps[b])]
        row: dict = {"target": target, "steps": steps, "batches_reached": reached}
        if len(reached) >= 3:
            mean_steps = [statistics.fmean(steps[b]) for b in reached]  # type: ignore[arg-type]
            row |= fit(reached, mean_steps)
            row["per_seed"] = [fit(reached, [steps[b][s] for b in reached])["b_crit"] for s in range(seeds)]  # type: ignore[misc]
            if math.isfinite(row["b_crit"]):
                row["tokens_at_gap_batch_over_min"] = 1 + GAP_BATCH / row["b_crit"]  # E(16) / E_min
                row["steps_at_learner_batch_over_min"] = 1 + row["b_crit"] / (GAP_BATCH // 4)  # S(4) / S_min
        per_target.append(row)
        b_crit = row.get("b_crit")
        say(
            f"target {target}: B_crit "
            + ("not fitted (fewer than 3 batch sizes reached it)" if b_crit is None else f"{b_crit:.1f} sequences")
            + (f" (R^2 {row['r2']:.3f}; per seed {', '.join(f'{b:.1f}' for b in row['per_seed'])})" if b_crit else "")
        )
    return {"lrs": lrs, "targets": per_target}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true", help="the 12k GPT, small batches and budget: a few minutes")
    p.add_argument("--json", action="store_true")
    p.add_argument("--size", default=None, help="the GPT (default 84k)")
    p.add_argument("--seeds", type=int, default=None)
    p.add_argument("--targets", type=float, nargs="+", default=None, help="losses to reach (default: per optimizer)")
    p.add_argument("--inner-optimizer", choices=INNER_OPTIMIZERS, default="muon")
    p.add_argument("--data", default=None, help="a text file (default: the package's bundled corpus)")
    p.add_argument("--out", type=Path, default=None, help="results file: runs written as each ends, resumed from")
    args = p.parse_args(argv)
    cfg = dict(QUICK if args.quick else FULL)
    cfg["size"] = args.size or cfg["size"]
    if args.targets:
        cfg["targets"] = {args.inner_optimizer: sorted(args.targets, reverse=True)}
    seeds = args.seeds or cfg["seeds"]
    torch.set_num_threads(1)
    curves = Curves(cfg, args.inner_optimizer, args.data, args.out)
    result = measure(curves, args.out and args.out.with_suffix(".tuning.json"), seeds)
    result |= {"config": curves.config | {"batches": cfg["batches"], "seeds": seeds}}
    if args.out is not None:
        args.out.write_text(json.dumps({"config": curves.config, "runs": curves.runs, "result": result}, indent=1))
    if args.json:
        print(json.dumps(result, sort_keys=True))
    return 0


if __name__ == "__main__":
    sys.exit(main())
