"""Why the gap to data-parallel: one round of M learners x H inner steps against data-parallel's H steps
on the very same tokens, from the same point of a data-parallel run (issue #47, item 4).

At equal tokens DiLoCo ends above data-parallel (`benchmarks/gap.py`). A round of DiLoCo replaces H
steps of data-parallel at global batch B with M learners taking H steps each at batch B / M and
averaging where they went (the outer gradient). This measures how good that average is as a step:

1. data-parallel trains the scaling table's model (`scaling.py`'s sizes) at 20 tokens per parameter,
   global batch B = 16 sequences, AdamW at its bracketed inner lr (benchmarks/tuning.py, seed 0);
2. at 10 %, 50 % and 90 % of the run, from the model theta0 and the optimizer's state there, for each
   H and M: data-parallel takes H more steps (batches b_1..b_H of B sequences) and goes to theta_dp;
   M learners, each from theta0 with an optimizer state of its own batch size (DP's state after
   --state-steps steps, 10, at batch B / M on other data, parameters put back), take H steps, learner m on rows
   m B/M .. (m+1) B/M of the same b_1..b_H, and go to theta_m. The outer gradient is
   delta = theta0 - mean_m theta_m; data-parallel's step is delta_dp = theta0 - theta_dp;
3. reported per cell: `cos` (delta against delta_dp), `norm_ratio` (|delta| / |delta_dp|),
   `learner_cos` (mean pairwise cosine of the learners' own deltas: how far they drift apart), and
   the eval loss each step buys at its best scale eta (theta0 - eta delta, eta bracketed; the same
   for data-parallel's delta_dp, so that neither gets a tuned step the other lacks): `gain_round`,
   `gain_dp`. The summary's `efficiency` is sum(gain_round) / sum(gain_dp) over the seeds and starting
   points of a size, H and M (a ratio per cell is noise where one step buys ~1e-4 nats): 0.8 means a
   round does 80 % of data-parallel's work with the same tokens. M = 1 is data-parallel itself (cos
   1, efficiency 1: the check).

One round, no outer momentum: it isolates what averaging does. Learners here start every round from
the same theta0 and a state of their own batch size, as after an adoption in a synchronous round.

    python benchmarks/gap_why.py --quick --json
    python benchmarks/gap_why.py --out benchmarks/results/gap-why.json --json    # 84k-237k x 3 seeds
"""

from __future__ import annotations

import argparse
import copy
import dataclasses
import itertools
import json
import math
import statistics
import sys
from collections.abc import Callable
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from scaling import gpt, parameters  # noqa: E402
from tuning import INNER_LR, Tuner  # noqa: E402

from ddiloco.train.corpus import encoded_corpus  # noqa: E402
from ddiloco.train.inner import (  # noqa: E402
    DEFAULT_LR,
    INNER_OPTIMIZERS,
    InnerConfig,
    inner_step,
    lr_at,
    make_inner_optimizer,
    set_lr,
)
from ddiloco.train.streams import Batch  # noqa: E402
from ddiloco.train.tasks import LanguageModelTask  # noqa: E402

FULL = dict(
    sizes=["84k", "148k", "237k"],
    ratio=20.0,
    seq_len=64,
    batch=16,
    eval_batches=20,
    seeds=3,
    state_steps=10,
    split="iid",
)
QUICK = dict(sizes=["25k"], ratio=4.0, seq_len=32, batch=8, eval_batches=4, seeds=2, state_steps=10, split="iid")
AT = (0.1, 0.5, 0.9)  # of the data-parallel run: where the rounds start
H_VALUES = (1, 4, 16, 64)
M_VALUES = (1, 2, 4, 8)
OUTER_LRS = (0.5, 0.7, 1.0, 1.4, 2.0)  # widened past an edge while the best sits on it


def flat(model: torch.nn.Module) -> torch.Tensor:
    return torch.cat([p.detach().reshape(-1) for p in model.parameters()])


def put(model: torch.nn.Module, values: torch.Tensor) -> None:
    """Set the model's parameters from one flat vector (`flat`'s order)."""
    offset = 0
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(values[offset : offset + p.numel()].view_as(p))
            offset += p.numel()


def cosine(a: torch.Tensor, b: torch.Tensor) -> float:
    return float(torch.nn.functional.cosine_similarity(a, b, dim=0))


def rows(batch: Batch, part: int, parts: int) -> Batch:
    """Rows part * n / parts .. (part + 1) * n / parts of a batch: one learner's share of it."""
    n = batch.inputs.shape[0] // parts
    sl = slice(part * n, (part + 1) * n)
    return Batch(batch.inputs[sl], batch.targets[sl], batch.tokens // parts)


def join(parts: list[Batch]) -> Batch:
    """The learners' batches as one data-parallel batch, learner 0's rows first (`rows` splits it back)."""
    return Batch(
        torch.cat([b.inputs for b in parts]), torch.cat([b.targets for b in parts]), sum(b.tokens for b in parts)
    )


def steps(task: LanguageModelTask, model: torch.nn.Module, opt: torch.optim.Optimizer, batches: list[Batch]) -> None:
    for b in batches:
        inner_step(model, opt, task.loss(model, b), grad_clip=1.0)


def best_outer_lr(loss_at: Callable[[float], float]) -> tuple[float, float]:
    """(eta, loss) of the lowest loss over OUTER_LRS, widened by a factor 1.4 past an edge until the
    best is inside (at most 6 times)."""
    grid = list(OUTER_LRS)
    losses = {eta: loss_at(eta) for eta in grid}
    for _ in range(6):
        best = min(losses, key=lambda eta: losses[eta])
        if best == grid[0]:
            grid.insert(0, round(grid[0] / 1.4, 4))
            losses[grid[0]] = loss_at(grid[0])
        elif best == grid[-1]:
            grid.append(round(grid[-1] * 1.4, 4))
            losses[grid[-1]] = loss_at(grid[-1])
        else:
            break
    best = min(losses, key=lambda eta: losses[eta])
    return best, losses[best]


def probe(
    task: LanguageModelTask,
    model: torch.nn.Module,
    opt: torch.optim.Optimizer,
    batches: list[Batch],
    own_state: list[Batch],
    m: int,
    eval_batches: int,
    inner: InnerConfig,
) -> dict:
    """One cell: from `model` and `opt` as they are (left unchanged), data-parallel's H = len(batches)
    steps against M = m learners' on the same rows; the figures of the module's docstring."""
    theta0 = flat(model)
    dp_model, dp_opt = clone(model, opt, inner)
    steps(task, dp_model, dp_opt, batches)
    delta_dp = theta0 - flat(dp_model)
    deltas = []
    for learner in range(m):
        lm, lo = clone(model, opt, inner)
        if m > 1:  # an optimizer state of the learner's batch size, then back to theta0
            steps(task, lm, lo, [rows(b, learner, m) for b in own_state])
            put(lm, theta0)
        steps(task, lm, lo, [rows(b, learner, m) for b in batches])
        deltas.append(theta0 - flat(lm))
    return figures(task, model, delta_dp, deltas, eval_batches)


def figures(
    task: LanguageModelTask,
    model: torch.nn.Module,
    delta_dp: torch.Tensor,
    deltas: list[torch.Tensor],
    eval_batches: int,
) -> dict:
    """The figures of one cell from `model`'s point (left unchanged): data-parallel's step `delta_dp`
    against the mean of the learners' `deltas`, each at its best scale on the eval loss. Apart from
    `probe` so that a round made elsewhere (`gap_across.py`: DiLoCo's own learners) is measured alike."""

    def loss(values: torch.Tensor) -> float:
        probe_model = copy.deepcopy(model)
        put(probe_model, values)
        return task.evaluate(probe_model, max_batches=eval_batches)["eval_loss"]

    theta0 = flat(model)
    delta = torch.stack(deltas).mean(0)
    loss0 = loss(theta0)
    eta_dp, loss_dp = best_outer_lr(lambda eta: loss(theta0 - eta * delta_dp))  # M = 1: the same as the round's
    eta, loss_round = best_outer_lr(lambda eta: loss(theta0 - eta * delta))
    pairs = [cosine(a, b) for a, b in itertools.combinations(deltas, 2)]
    return {
        "cos": cosine(delta, delta_dp),
        "norm_ratio": float(delta.norm() / delta_dp.norm()),
        "learner_cos": statistics.fmean(pairs) if pairs else 1.0,
        "loss0": loss0,
        "loss_dp": loss_dp,
        "loss_round": loss_round,
        "outer_lr": eta,
        "dp_outer_lr": eta_dp,
        "gain_dp": loss0 - loss_dp,
        "gain_round": loss0 - loss_round,
    }


def clone(
    model: torch.nn.Module, opt: torch.optim.Optimizer, inner: InnerConfig
) -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    """A copy of the model and an optimizer over it with a copy of `opt`'s state and learning rate."""
    twin = copy.deepcopy(model)
    twin_opt = make_inner_optimizer(twin, inner)
    twin_opt.load_state_dict(copy.deepcopy(opt.state_dict()))
    return twin, twin_opt


class Study:
    """A size's data-parallel run (its lr bracketed once) and the rounds probed along it."""

    def __init__(self, cfg: dict, data: str | None, tuning: Path | None) -> None:
        """`tuning`: the file data-parallel's lr tuning is saved to and resumed from."""
        self.cfg, self.data = cfg, data
        self.tasks: dict[str, LanguageModelTask] = {}
        context = {k: cfg[k] for k in ("ratio", "seq_len", "batch", "eval_batches")} | {"data": data}
        self.optimizer = cfg.get("inner_optimizer", "adamw")
        if self.optimizer != "adamw":  # (AdamW's tuning files were made before the flag, without it)
            context["inner_optimizer"] = self.optimizer
        self.tuner = Tuner(self.final_loss, tuning, context, say=say)

    def task(self, size: str) -> LanguageModelTask:
        if size not in self.tasks:
            corpus = encoded_corpus(self.data and Path(self.data), "byte", 1024, 0.1)
            # contiguous shards, as gap.json's runs were made, which these probes explain
            self.tasks[size] = LanguageModelTask("gpt", gpt(size, self.cfg["seq_len"]), corpus, "contiguous")
        return self.tasks[size]

    def inner(self, lr: float) -> InnerConfig:
        # AdamW unless --inner-optimizer says otherwise: gap-why*.json were made with it, before the
        # package's default became Muon
        return InnerConfig(lr=lr, batch_size=self.cfg["batch"], warmup_steps=10, optimizer=self.optimizer)

    def total_steps(self, size: str) -> int:
        tokens = self.cfg["ratio"] * parameters(size, self.cfg["seq_len"])
        return max(1, int(tokens // (self.cfg["batch"] * self.cfg["seq_len"])))

    def train(self, size: str, lr: float, seed: int, visit: Callable | None = None) -> float:
        """Data-parallel's run (one process, global batch B: what DDP computes); `visit(model, opt,
        step)` at each of AT; its final eval loss."""
        task, inner, total = self.task(size), self.inner(lr), self.total_steps(size)
        model = task.build_model(seed)
        opt = make_inner_optimizer(model, inner)
        stream = task.stream(0, 1, self.cfg["batch"], seed)
        marks = {int(a * total) for a in AT}
        for step in range(total):
            if visit is not None and step in marks:
                visit(model, opt, step)
            set_lr(opt, lr_at(inner, step, step / total))
            inner_step(model, opt, task.loss(model, stream.batch_at(step)), inner.grad_clip)
        return task.evaluate(model, max_batches=self.cfg["eval_batches"])["eval_loss"]

    def final_loss(self, label: str, settings: dict[str, float]) -> float:
        return self.train(label, settings["inner_lr"], int(settings["seed"]))

    def tuned_lr(self, size: str) -> float:
        """Data-parallel's inner lr at `size`, bracketed on seed 0 (resumed from the tuning file)."""
        # AdamW's grid as its tuning files were made; another optimizer's centred on its own default lr
        start = INNER_LR
        if self.optimizer != "adamw":
            start = dataclasses.replace(INNER_LR, default=DEFAULT_LR[self.optimizer])
        return self.tuner.tune(size, (start,), fixed={"seed": 0.0})["chosen"]["inner_lr"]

    def cells(self, size: str, seed: int) -> list[dict]:
        lr = self.tuned_lr(size)
        task, out = self.task(size), []
        batch, split = self.cfg["batch"], self.cfg["split"]

        def data(m: int, index: int, count: int) -> list[Batch]:
            """`count` batches of B rows for a round of M = m learners, from `index` on. iid: rows drawn
            from the whole corpus (learner l takes rows l B/M .. of each); shards: learner l's rows from
            its own contiguous shard of M, as in a run (data-parallel's batch is theirs together, as a
            DDP step's is its workers')."""
            if split == "iid" or m == 1:
                whole = task.stream(0, 1, batch, seed + 1000)  # the rounds' data: not the run's
                return [whole.batch_at(index + i) for i in range(count)]
            streams = [task.stream(learner, m, batch // m, seed + 1000) for learner in range(m)]
            return [join([s.batch_at(index + i) for s in streams]) for i in range(count)]

        def visit(model: torch.nn.Module, opt: torch.optim.Optimizer, step: int) -> None:
            at = round(step / self.total_steps(size), 2)
            for h in H_VALUES:
                for m in M_VALUES:
                    batches = data(m, step * 997 + h * 131, h)
                    own = data(m, 10**7 + step * 997, self.cfg["state_steps"])
                    cell = probe(task, model, opt, batches, own, m, self.cfg["eval_batches"], self.inner(lr))
                    out.append({"size": size, "seed": seed, "at": at, "H": h, "M": m, "dp_inner_lr": lr, **cell})
                    say(
                        f"{size} seed {seed} at {at:.0%} H {h} M {m}: cos {cell['cos']:.3f} "
                        f"norm {cell['norm_ratio']:.2f} gain {cell['gain_round']:.4f} against {cell['gain_dp']:.4f}"
                    )

        self.train(size, lr, seed, visit)
        return out


def say(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def summarize(cells: list[dict]) -> list[dict]:
    """Per size, H and M: the figures' mean and standard deviation over seeds and starting points."""
    groups: dict[tuple, list[dict]] = {}
    for c in cells:
        groups.setdefault((c["size"], c["H"], c["M"]), []).append(c)
    out = []
    for (size, h, m), cs in sorted(groups.items(), key=lambda kv: (parameters(kv[0][0], 64), kv[0][1], kv[0][2])):
        row: dict = {"size": size, "H": h, "M": m, "n": len(cs)}
        for key in ("cos", "norm_ratio", "learner_cos", "outer_lr", "dp_outer_lr"):
            values = [c[key] for c in cs]
            row[key] = statistics.fmean(values)
            row[f"{key}_sd"] = statistics.stdev(values) if len(values) > 1 else 0.0
        gain_dp = sum(c["gain_dp"] for c in cs)
        row["efficiency"] = sum(c["gain_round"] for c in cs) / gain_dp if gain_dp > 0 else math.nan
        row["gain_dp"] = gain_dp / len(cs)
        out.append(row)
    return out


def parser(doc: str | None) -> argparse.ArgumentParser:
    """The flags of the probes along data-parallel's run (this one and noise_scale.py)."""
    p = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true")
    p.add_argument("--json", action="store_true")
    p.add_argument("--sizes", nargs="+", default=None)
    p.add_argument("--seeds", type=int, default=None)
    p.add_argument("--data", default=None, help="a text file (default: the package's bundled corpus)")
    p.add_argument(
        "--inner-optimizer",
        choices=INNER_OPTIMIZERS,
        default="adamw",
        help="data-parallel's (and the learners') inner optimizer: AdamW by default, as the committed files "
        "were made; another at its own bracketed lr",
    )
    return p


def main(argv: list[str] | None = None) -> int:
    p = parser(__doc__)
    p.add_argument(
        "--split",
        choices=("iid", "shards"),
        default="iid",
        help="the learners' rows: drawn from the whole corpus, or each from its own shard as in a run",
    )
    p.add_argument(
        "--state-steps", type=int, default=None, help="steps that give a learner's optimizer its own batch's state"
    )
    p.add_argument("--out", type=Path, default=None, help="results file: written as cells end, resumed from")
    args = p.parse_args(argv)
    cfg = dict(QUICK if args.quick else FULL)
    cfg["sizes"] = args.sizes or cfg["sizes"]
    cfg["seeds"] = args.seeds or cfg["seeds"]
    cfg["state_steps"] = cfg["state_steps"] if args.state_steps is None else args.state_steps
    cfg["split"] = args.split
    if args.inner_optimizer != "adamw":  # (files made before the flag are AdamW's, without the key)
        cfg["inner_optimizer"] = args.inner_optimizer
    torch.set_num_threads(1)
    saved = json.loads(args.out.read_text()) if args.out and args.out.is_file() else {}
    config = {k: cfg[k] for k in cfg if k not in ("sizes", "seeds")} | {"data": args.data}
    same = {"state_steps": 10, "split": "iid", **saved.get("config", {})} == config  # (files from before the flags)
    cells: list[dict] = saved.get("cells", []) if same else []
    study = Study(cfg, args.data, args.out and args.out.with_suffix(".tuning.json"))
    for size in cfg["sizes"]:
        for seed in range(cfg["seeds"]):
            if any(c["size"] == size and c["seed"] == seed for c in cells):
                continue
            cells += study.cells(size, seed)
            if args.out:
                tmp = args.out.with_suffix(".tmp")
                tmp.write_text(json.dumps({"config": config, "cells": cells}, indent=1))
                tmp.replace(args.out)
    wanted = [c for c in cells if c["size"] in cfg["sizes"] and c["seed"] < cfg["seeds"]]
    summary = summarize(wanted)
    for r in summary:
        say(
            f"{r['size']:>5} H {r['H']:>2} M {r['M']}: cos {r['cos']:.3f} +- {r['cos_sd']:.3f}  "
            f"norm {r['norm_ratio']:.2f}  learners {r['learner_cos']:.2f}  "
            f"efficiency {r['efficiency']:.2f} (eta {r['outer_lr']:.2f}, data-parallel's {r['dp_outer_lr']:.2f}; "
            f"its gain {r['gain_dp']:.4f})"
        )
    if args.json:
        print(json.dumps({"summary": summary, "cells": wanted, "config": cfg}, sort_keys=True))
    return 0


if __name__ == "__main__":
    sys.exit(main())
