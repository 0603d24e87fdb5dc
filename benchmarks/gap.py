"""The quality gap to data-parallel, and what each algorithm option buys against it (issue #47).

Virtual clock, no failures, the scaling table's models (`scaling.py`) at 20 tokens per parameter: at
each size, data-parallel (4 workers), synchronous DiLoCo and Decoupled DiLoCo with M = 4 train the
same tokens at the same global batch, and the gap is each method's final eval loss over
data-parallel's, in percent, paired by seed (seed s against data-parallel's seed s), mean and standard
error over the seeds.

Every configuration is tuned the same way before it is measured (benchmarks/tuning.py, the fair-race
tuner: a grid is widened until its choice is strictly inside it), on seed 0:

    data-parallel        its inner lr
    each DiLoCo method   its inner lr, outer lr and outer momentum, with no option on (the baseline)
    each option alone    the outer lr again, with the option on (inner lr and momentum the baseline's;
                         an option that changes the inner optimizer, Muon, tunes all three again, as
                         its baseline did: data-parallel with it tunes its inner lr again too)
    the best combination the options that beat the baseline by more than its standard error, together,
                         the outer lr tuned again

each round over a method's settings repeated, at the others' latest choices, until a round changes
nothing (at most PASSES), so that three settings that interact are tuned as far as data-parallel's one;
and then run at its chosen point with every seed. An option is measured where it can act: the
stale-work correction only where work can be late (decoupled). Options are in `OPTIONS`; those the
installed package does not have are left out with a line that says so.

Sizes run smallest first, and two rules keep the larger ones affordable (a 237k run costs about eight
84k runs), the same for every method, data-parallel included:

    each tuning at a larger size starts its grids at the choice the same configuration made at the
    size before (the scaling laws' outer lr does not move with size; where the inner lr does, the
    tuner widens as it always does), so a grid is no narrower, only better centred;
    an option that did not beat its method's baseline by more than the baseline's standard error at
    any smaller size is not measured again (`--every-option` measures each at every size); the report
    names what was left out where (`not_carried`).

Every run is kept in a results file as it ends (the tuner's, atomically) and a rerun resumes from it
(full size costs hours on 2 cores: run it under `flock /tmp/cpu.lock`, across sessions if needed).

    python benchmarks/gap.py --quick --json                       # tiny models: minutes
    python benchmarks/gap.py --out benchmarks/results/gap.json    # 84k, 148k, 237k x 3 seeds: hours
    python benchmarks/gap.py --out benchmarks/results/gap.json --methods diloco-m4 &   # or a core each,
    python benchmarks/gap.py --out benchmarks/results/gap.json --methods decoupled-m4  # on one runs file;
    python benchmarks/gap.py --out benchmarks/results/gap.json    # then this writes the report from it
    python benchmarks/gap.py --load benchmarks/results/gap.json --json   # the cells of a results file
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
from scaling import SPECS, algorithm, gpt, parameters  # noqa: E402
from tuning import DATA_PARALLEL, DILOCO_FAMILY, OUTER_LR, Tuner, worst  # noqa: E402

from ddiloco.core import AlgorithmConfig  # noqa: E402
from ddiloco.sim.config import SimConfig  # noqa: E402
from ddiloco.sim.run import run_sim  # noqa: E402
from ddiloco.train.corpus import encoded_corpus  # noqa: E402
from ddiloco.train.inner import InnerConfig  # noqa: E402
from ddiloco.train.streams import SHARD_LAYOUTS  # noqa: E402
from ddiloco.train.tasks import LanguageModelTask  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
FULL = dict(sizes=["84k", "148k", "237k"], ratio=20.0, seq_len=64, sync_every=16, global_batch=16, eval_batches=20)
QUICK = dict(sizes=["12k", "25k"], ratio=4.0, seq_len=32, sync_every=8, global_batch=8, eval_batches=4)
SEEDS = 3
PASSES = 4  # rounds over a method's settings until one changes nothing (tuning.py): DiLoCo's three settings
# interact (its outer lr's best moves with the momentum), data-parallel's one does not
METHODS = ("diloco-m4", "decoupled-m4")  # against "ddp" (scaling.SPECS)
#: option name: (the settings it turns on, AlgorithmConfig or InnerConfig fields; the methods it acts in).
#: An option data-parallel can use too (an inner optimizer) is measured against data-parallel with it.
OPTIONS: dict[str, tuple[dict[str, object], tuple[str, ...]]] = {
    "outer_debias": ({"outer_debias": True}, METHODS),
    "outer_restart": ({"outer_restart_every": 8}, METHODS),
    "outer_lr_per_learner": ({"outer_lr_per_learner": 0.25}, METHODS),
    "stale_correction": ({"stale_correction": True}, ("decoupled-m4",)),
    "muon": ({"optimizer": "muon"}, (*METHODS, "ddp")),  # an inner optimizer: data-parallel gets it too
    "slow_momentum": ({"slow_momentum": 0.99}, METHODS),
    "rewarm": ({"rewarm_steps": 10}, METHODS),
}
BASELINE_OPTIMIZER = "adamw"  # "none" in the rows: the paper's inner optimizer
ALGORITHM_FIELDS = {f.name for f in dataclasses.fields(AlgorithmConfig)}
INNER_FIELDS = {f.name for f in dataclasses.fields(InnerConfig)}


def available(options: dict = OPTIONS) -> tuple[dict, list[str]]:
    """The options this package has (each field in AlgorithmConfig or InnerConfig), and the names of
    those it lacks."""
    have = {n: o for n, o in options.items() if set(o[0]) <= ALGORITHM_FIELDS | INNER_FIELDS}
    return have, sorted(set(options) - set(have))


def sim_config(
    cfg: dict, size: str, method: str, settings: dict[str, float], turned_on: dict[str, object]
) -> SimConfig:
    """One run's config: the cell's model and budget, the method's schedule (scaling.py's), the tuned
    rates in `settings` (and its `seed`), the options `turned_on`."""
    sim_method, learners = SPECS[method]
    algo = {k: v for k, v in turned_on.items() if k in ALGORITHM_FIELDS}
    inner = {k: v for k, v in turned_on.items() if k in INNER_FIELDS}
    base = algorithm(sim_method, settings.get("outer_lr", 0.7), cfg["sync_every"])
    if sim_method != "ddp":
        base = dataclasses.replace(base, outer_momentum=settings.get("outer_momentum", 0.5), **algo)  # type: ignore[arg-type]
    params = parameters(size, cfg["seq_len"])
    return SimConfig(
        method=sim_method,  # type: ignore[arg-type]  # one of SPECS' sim methods
        seq_len=cfg["seq_len"],
        shard_layout=cfg.get("shard_layout", SHARD_LAYOUTS[0]),  # what `Cells`' task deals
        learners=learners,
        tokens=int(round(cfg["ratio"] * params)),
        seed=int(settings.get("seed", 0)),
        eval_batches=cfg["eval_batches"],
        inner=InnerConfig(
            lr=settings["inner_lr"],
            batch_size=cfg["global_batch"] // learners,
            warmup_steps=10,
            # the baseline is AdamW whatever InnerConfig's default: its rows and the runs file mean one thing
            **{"optimizer": BASELINE_OPTIMIZER, **inner},  # type: ignore[arg-type]
        ),
        algorithm=AlgorithmConfig() if sim_method == "ddp" else base,
    )


class Cells:
    """Runs a configuration (cell, method, options, rates, seed) at most once: every run goes through
    one tuner, whose results file keeps it (`Tuner.loss`), so a rerun resumes."""

    def __init__(self, cfg: dict, data: str | None, out: Path | None) -> None:
        self.cfg, self.data = cfg, data
        self.tasks: dict[str, LanguageModelTask] = {}
        context = {k: cfg[k] for k in ("ratio", "seq_len", "sync_every", "global_batch", "eval_batches")}
        context["data"] = data  # runs of another model, budget or data are not mixed in
        self.layout = cfg.get("shard_layout", SHARD_LAYOUTS[0])  # the package's default: interleaved
        if self.layout != "contiguous":  # (runs files made before the flag are contiguous, without it)
            context["shard_layout"] = self.layout
        say = lambda line: print(line, file=sys.stderr, flush=True)  # noqa: E731
        self.tuner = Tuner(self._objective, out, context, say=say, passes=PASSES)
        self.previous: dict[str, dict[str, float]] = {}  # "/method/options": the last size's choice
        self.tuned: dict[str, dict[str, float]] = {}  # the same, at the size being tuned

    def centred(self, method: str, names: tuple[str, ...], settings: tuple) -> tuple:
        """`settings` with their first grids centred on the choice this configuration made at the last
        size tuned (as they are: at the first size)."""
        before = self.previous.get(label("", method, names), {})
        return tuple(dataclasses.replace(s, default=before[s.name]) if s.name in before else s for s in settings)

    def _objective(self, label: str, settings: dict[str, float]) -> float:
        size, method, names = label.split("/")
        turned_on = {k: v for n in names.split("+") if n for k, v in OPTIONS[n][0].items()}
        if size not in self.tasks:
            corpus = encoded_corpus(self.data and Path(self.data), "byte", 1024, 0.1)
            self.tasks[size] = LanguageModelTask("gpt", gpt(size, self.cfg["seq_len"]), corpus, self.layout)
        result = run_sim(sim_config(self.cfg, size, method, settings, turned_on), task=self.tasks[size])
        return float(result["eval_loss"])

    def tune(self, size: str, method: str, names: tuple[str, ...], settings: tuple, fixed: dict) -> dict:
        out = self.tuner.tune(label(size, method, names), self.centred(method, names, settings), {"seed": 0.0, **fixed})
        self.tuned[label("", method, names)] = {k: v for k, v in out["chosen"].items() if k != "seed"}
        return out

    def next_size(self) -> None:
        """What was tuned at this size centres the next size's grids."""
        self.previous, self.tuned = {**self.previous, **self.tuned}, {}

    def seeds(self, size: str, method: str, names: tuple[str, ...], chosen: dict[str, float]) -> list[float]:
        """The final loss at `chosen` for every seed (seed 0 is the tuning's own run)."""
        return [
            self.tuner.loss(label(size, method, names), {**chosen, "seed": float(s)}) for s in range(self.cfg["seeds"])
        ]


def label(size: str, method: str, names: tuple[str, ...]) -> str:
    return f"{size}/{method}/{'+'.join(sorted(names))}"


def gap(losses: list[float], baseline: list[float]) -> tuple[float, float]:
    """Mean and standard error over seeds of the percent gap, seed s against the baseline's seed s."""
    pct = [100.0 * (worst(a) / b - 1.0) for a, b in zip(losses, baseline, strict=True)]
    if not all(math.isfinite(p) for p in pct):  # a diverged run: no gap to average
        return math.inf, math.nan
    se = statistics.stdev(pct) / math.sqrt(len(pct)) if len(pct) > 1 else math.nan
    return statistics.fmean(pct), se


def cell(
    cells: Cells,
    size: str,
    options: dict,
    carried: dict[str, set[str]] | None = None,
    methods: tuple[str, ...] = METHODS,
) -> list[dict]:
    """One size: data-parallel tuned and seeded, then each DiLoCo method's baseline, options and best
    combination, each tuned, seeded and measured against data-parallel. `carried`: per method, the only
    options measured (None: all); `winners` of the rows tells the next size's."""
    out = []

    def measure(method: str, names: tuple[str, ...], tuned: dict) -> dict:
        shared = tuple(n for n in names if "ddp" in OPTIONS[n][1])  # data-parallel runs with these too
        ddp = cells.tune(size, "ddp", shared, DATA_PARALLEL, {})
        ddp_losses = cells.seeds(size, "ddp", shared, ddp["chosen"])
        losses = cells.seeds(size, method, names, tuned["chosen"])
        mean, se = gap(losses, ddp_losses)
        row = {"size": size, "method": method.split("-")[0], "M": SPECS[method][1], "options": sorted(names)}
        row["option_set"] = "+".join(sorted(names)) or "none"  # the options as one name, for selectors
        row |= {"gap_pct": mean, "gap_se": se, "seeds": len(losses), "loss_mean": statistics.fmean(losses)}
        row |= {"ddp_loss_mean": statistics.fmean(ddp_losses), "ddp_options": sorted(shared), "chosen": tuned["chosen"]}
        row["bracketed"] = all(tuned["bracketed"].values()) and all(ddp["bracketed"].values())
        out.append(row)
        return row

    for method in methods:
        base_tuned = cells.tune(size, method, (), DILOCO_FAMILY, {})
        base = measure(method, (), base_tuned)
        winners = []
        for name, (_, where) in options.items():
            if method in where and (carried is None or name in carried.get(method, set())):
                settings, held = retuned((name,), base_tuned["chosen"])
                alone = measure(method, (name,), cells.tune(size, method, (name,), settings, held))
                alone["beat_baseline"] = alone["gap_pct"] < base["gap_pct"] - (
                    base["gap_se"] if math.isfinite(base["gap_se"]) else 0.0
                )
                if alone["beat_baseline"]:
                    winners.append(name)
        if len(winners) > 1:
            settings, held = retuned(tuple(winners), base_tuned["chosen"])
            measure(method, tuple(winners), cells.tune(size, method, tuple(winners), settings, held))
    return out


def retuned(names: tuple[str, ...], baseline: dict[str, float]) -> tuple[tuple, dict[str, float]]:
    """What an option's run tunes again, and what it keeps of the baseline's choice: the outer lr; and
    where an option changes the inner optimizer, everything the baseline tuned (Muon's best rate is not
    AdamW's, and its outer gradients are not AdamW's either: data-parallel with Muon gets its inner lr
    tuned again, so DiLoCo with it gets the whole tuning its baseline had)."""
    if any("optimizer" in OPTIONS[n][0] for n in names):
        return DILOCO_FAMILY, {}
    return (OUTER_LR,), {k: baseline[k] for k in ("inner_lr", "outer_momentum")}


def winners(rows: list[dict]) -> dict[str, set[str]]:
    """Per method ("diloco-m4", ...), the options that, alone, beat its baseline in these rows."""
    out: dict[str, set[str]] = {}
    for r in rows:
        if r.get("beat_baseline"):
            out.setdefault(f"{r['method']}-m{r['M']}", set()).update(r["options"])
    return out


def carried_rows(
    cells: Cells, sizes: list[str], options: dict, every_option: bool, methods: tuple[str, ...] = METHODS
) -> tuple[list[dict], dict]:
    """Every size's rows, smallest first; unless `every_option`, a size measures only the options that
    beat their baseline at a smaller one. Also what was left out where: {size: {method: [options]}}."""
    rows: list[dict] = []
    not_carried: dict[str, dict[str, list[str]]] = {}
    for i, size in enumerate(sizes):
        carried = None if every_option or i == 0 else winners(rows)
        if carried is not None:
            for method in methods:
                left = sorted(
                    n for n, (_, where) in options.items() if method in where and n not in carried.get(method, set())
                )
                if left:
                    not_carried.setdefault(size, {})[method] = left
                    print(
                        f"{size} {method}: not measured again (no gain at a smaller size): {', '.join(left)}",
                        file=sys.stderr,
                    )
        rows += cell(cells, size, options, carried, methods)
        cells.next_size()
    return rows, not_carried


def report(rows: list[dict], skipped: list[str], not_carried: dict | None = None) -> dict:
    best = {}
    for r in rows:
        key = f"{r['size']}/{r['method']}"
        if key not in best or r["gap_pct"] < best[key]["gap_pct"]:
            best[key] = r
    return {"cells": rows, "best": best, "options_missing": skipped, "not_carried": not_carried or {}}


def show(rows: list[dict]) -> None:
    for r in rows:
        options = "+".join(r["options"]) or "(none)"
        print(
            f"{r['size']:>5} {r['method']:<9} M={r['M']} {options:<40} gap {r['gap_pct']:+6.2f} % "
            f"± {r['gap_se']:.2f} ({r['seeds']} seeds; loss {r['loss_mean']:.4f} vs {r['ddp_loss_mean']:.4f})"
            + ("" if r["bracketed"] else "  [not bracketed]"),
            file=sys.stderr,
        )


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true", help="two tiny sizes at 4 tokens per parameter: minutes")
    p.add_argument("--json", action="store_true", help="end with one JSON line: the cells")
    p.add_argument("--out", type=Path, default=None, help="results file (resumed from if it exists)")
    p.add_argument("--load", type=Path, default=None, help="the cells of this results file (runs nothing)")
    p.add_argument("--seeds", type=int, default=SEEDS)
    p.add_argument("--sizes", nargs="+", default=None, help="a subset of the sizes")
    p.add_argument("--data", default=None, help="training text (default: the Python standard library's source)")
    p.add_argument(
        "--shard-layout",
        choices=SHARD_LAYOUTS,
        default="interleaved",
        help="how the text is dealt to the learners (the package's default; gap.json was made contiguous)",
    )
    p.add_argument(
        "--methods",
        nargs="+",
        choices=METHODS,
        default=list(METHODS),
        help="a subset of the methods: one process per method shares one runs file (a core each)",
    )
    p.add_argument(
        "--global-batch",
        type=int,
        default=None,
        help="sequences per step over all learners (default 16; the cells' question: does the gap depend on it?)",
    )
    p.add_argument(
        "--options",
        nargs="*",
        default=None,
        help="measure only these options (none given: the baselines alone; default: all of OPTIONS)",
    )
    p.add_argument(
        "--every-option",
        action="store_true",
        help="measure every option at every size (default: past the first size, only those that beat the baseline)",
    )
    args = p.parse_args(argv)
    torch.set_num_threads(1)
    if args.load:
        saved = json.loads(args.load.read_text())
        out = saved["report"]
    else:
        cfg = dict(QUICK if args.quick else FULL, seeds=args.seeds)
        cfg["sizes"] = args.sizes or cfg["sizes"]
        cfg["global_batch"] = args.global_batch or cfg["global_batch"]
        cfg["shard_layout"] = args.shard_layout
        path = args.out or ROOT / "benchmarks" / "results" / ("gap-quick.json" if args.quick else "gap.json")
        options, skipped = available()
        if args.options is not None:
            unknown = sorted(set(args.options) - set(OPTIONS))
            if unknown:
                p.error(f"--options: unknown {', '.join(unknown)} (choose from {', '.join(OPTIONS)})")
            options = {n: o for n, o in options.items() if n in args.options}
        for name in skipped:
            print(f"option {name}: not in this package; left out", file=sys.stderr)
        cells = Cells(cfg, args.data, path.with_suffix(".runs.json"))
        rows, not_carried = carried_rows(cells, cfg["sizes"], options, args.every_option, tuple(args.methods))
        out = report(rows, skipped, not_carried)
        if set(args.methods) == set(METHODS):
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(json.dumps({"config": cfg, "data": args.data, "report": out}, indent=1) + "\n")
        else:  # the report of a part would overwrite the whole's: a run of every method writes it
            print(f"{', '.join(args.methods)} only: {path} is written by a run of every method", file=sys.stderr)
    show(out["cells"])
    if args.json:
        print(json.dumps(out, sort_keys=True))
    return 0


if __name__ == "__main__":
    sys.exit(main())
