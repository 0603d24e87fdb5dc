"""Quality at fixed tokens per parameter: does the gap to data-parallel shrink with model size, as the
DiLoCo scaling-law paper (Charles et al., arXiv 2503.09799) finds? Virtual clock, no failures.

Every size is trained for `ratio` tokens per parameter (20, and a second ratio at some sizes) by
data-parallel (4 workers), synchronous DiLoCo with M = 1, 2, 4 and Decoupled DiLoCo with M = 4
(P = 4, tau = 2, K = 1, gamma = 0.9), outer momentum 0.5, H the same for the whole family. Each method
tunes one learning rate per size (data-parallel: the inner lr; the DiLoCo family: the outer lr, its
inner lr fixed at data-parallel's best at that size) against the global batch G in sequences (G / M
per learner; at equal G every method takes the same number of inner steps): a rate's loss is its best
G, and the rate is bracketed by benchmarks/tuning.py, from the configured rates (3e-3, 6e-3; 0.5, 1.0)
widened by factors of 2 past the edge the best sits on until it is strictly inside (at most 4 times;
one still on an edge is reported as not bracketed). The best point per method and size is reported
with its settings; the two largest sizes of the first ratio are run again at those points with a
second seed. (A results file made before the bracketing, without its `tuning`, keeps its fixed grid.)
Then loss(N) is fitted as a power law per method, and the gap to data-parallel as a trend in log N,
with where that trend would reach parity. Last, at a few cheap cells, the configured grid is widened
one step past its low edges (G = 4, outer lr 0.25): is each method's best on that grid its best at
all (`scaling_edges.py`; a fixed-grid probe, apart from the bracketing)?

    python benchmarks/scaling.py --quick --json      # tiny models and budgets: minutes on 2 cores
    python benchmarks/scaling.py --jobs 2 --out benchmarks/results/scaling.json   # hours: saved after
                                                      # every run, and started again it resumes from that file
    python benchmarks/scaling.py --load benchmarks/results/scaling.json  # the table and fits of a file
"""

from __future__ import annotations

import argparse
import functools
import json
import multiprocessing as mp
import os
import sys
import threading
import time
from concurrent.futures import ProcessPoolExecutor, as_completed
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from scaling_batch import batch_penalties, print_batches  # noqa: E402
from scaling_edges import edge_report, print_edges  # noqa: E402
from scaling_fit import METHODS, choose, fits, print_report  # noqa: E402
from tuning import Setting, Tuner, worst  # noqa: E402

from ddiloco.core import AlgorithmConfig  # noqa: E402
from ddiloco.sim.config import SimConfig  # noqa: E402
from ddiloco.sim.run import run_sim  # noqa: E402
from ddiloco.train.corpus import encoded_corpus  # noqa: E402
from ddiloco.train.gpt import GPT, GPTConfig  # noqa: E402
from ddiloco.train.inner import INNER_OPTIMIZERS, InnerConfig  # noqa: E402
from ddiloco.train.streams import SHARD_LAYOUTS  # noqa: E402
from ddiloco.train.tasks import LanguageModelTask  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
#: GPT width, depth and heads per size (byte vocabulary; named by their parameters at seq_len 64).
SIZES: dict[str, tuple[int, int, int]] = {
    "12k": (16, 1, 1),
    "25k": (24, 2, 2),
    "44k": (32, 2, 2),
    "84k": (48, 2, 3),
    "148k": (56, 3, 4),
    "237k": (64, 4, 4),
    "357k": (80, 4, 4),
    "880k": (128, 4, 4),
    "1.9m": (192, 4, 4),
}
FULL = dict(
    plan={20.0: ["25k", "44k", "84k", "148k", "237k"], 5.0: ["44k", "84k", "148k"]},
    seq_len=64,
    sync_every=16,
    inner_lrs=[3e-3, 6e-3],
    outer_lrs=[0.5, 1.0],
    # G = 64 was the worst batch at every method and size up to 148k, and 16 the best: the grid moved down
    # a step (the G = 64 runs stay in the results file, shown as grid points)
    global_batches=[8, 16, 32],
    extra_seeds=[1],
    eval_batches=20,
    # the best points sit on the grid's low edges (G = 8, outer lr 0.5): one step past them at the cheap
    # cells (scaling_edges.py); these runs are off the grid above, so they change neither table nor fits
    edges=dict(cells=[[20.0, "25k"], [20.0, "44k"], [5.0, "44k"], [5.0, "84k"]], global_batches=[4], outer_lrs=[0.25]),
)
QUICK = dict(
    plan={4.0: ["12k", "25k"], 2.0: ["12k"]},
    seq_len=32,
    sync_every=8,
    inner_lrs=[3e-3, 6e-3],
    outer_lrs=[0.5, 1.0],
    global_batches=[8],
    extra_seeds=[1],
    eval_batches=4,
    edges=dict(cells=[[4.0, "12k"]], global_batches=[4], outer_lrs=[0.25]),
)
DDP_WORKERS = 4
RESUME_KEYS = (
    "seq_len",
    "sync_every",
    "eval_batches",
    "inner_optimizer",
    "shard_layout",
)  # a file resumes only runs made like these
# a file made before 0.4 names no optimizer and no shard layout: it was AdamW's, its shards contiguous
BEFORE_0_4 = {"inner_optimizer": "adamw", "shard_layout": "contiguous"}
#: method name: (sim method, learners)
SPECS = {
    "ddp": ("ddp", DDP_WORKERS),
    "diloco-m1": ("diloco", 1),
    "diloco-m2": ("diloco", 2),
    "diloco-m4": ("diloco", 4),
    "decoupled-m4": ("decoupled", 4),
}


def gpt(size: str, seq_len: int) -> GPTConfig:
    d, layers, heads = SIZES[size]
    return GPTConfig(vocab_size=256, seq_len=seq_len, d_model=d, n_layers=layers, n_heads=heads)


@functools.cache
def parameters(size: str, seq_len: int) -> int:
    with torch.device("meta"):
        return sum(p.numel() for p in GPT(gpt(size, seq_len)).parameters())


def algorithm(method: str, outer_lr: float, sync_every: int) -> AlgorithmConfig:
    if method == "decoupled":
        return AlgorithmConfig(
            fragments=4, sync_every=sync_every, overlap=2, quorum=1, grace=0.9, outer_lr=outer_lr, outer_momentum=0.5
        )
    return AlgorithmConfig(  # SimConfig.effective_algorithm makes it blocking with K = M
        fragments=1, sync_every=sync_every, overlap=0, grace=0.0, merge="mean", outer_lr=outer_lr, outer_momentum=0.5
    )


def job(cfg: dict, ratio: float, size: str, method: str, seed: int, inner_lr: float, outer_lr, batch: int) -> dict:  # noqa: ANN001
    learners = SPECS[method][1]
    params = parameters(size, cfg["seq_len"])
    return {
        "ratio": ratio,
        "size": size,
        "params": params,
        "tokens": int(round(ratio * params)),
        "method": method,
        "learners": learners,
        "seed": seed,
        "inner_lr": inner_lr,
        "outer_lr": outer_lr,
        "global_batch": batch,
        "per_learner_batch": batch // learners,
    }


def ident(row: dict) -> tuple:
    return tuple(row[k] for k in ("ratio", "size", "method", "seed", "inner_lr", "outer_lr", "global_batch"))


_TASKS: dict[tuple, LanguageModelTask] = {}  # per process: a size's model config and its encoded corpus


def train(cfg: dict, data: str | None, j: dict) -> dict:
    """One job on the virtual clock: its row (the job's fields and what the run measured). Module level,
    so that a worker process of `--jobs` can run it."""
    method, learners = SPECS[j["method"]]
    layout = cfg.get("shard_layout", BEFORE_0_4["shard_layout"])
    if (j["size"], data) not in _TASKS:
        corpus = encoded_corpus(data and Path(data), "byte", 1024, 0.1)
        _TASKS[(j["size"], data)] = LanguageModelTask("gpt", gpt(j["size"], cfg["seq_len"]), corpus, layout)
    config = SimConfig(
        method=method,  # type: ignore[arg-type]  # one of SPECS' sim methods
        data=data,
        seq_len=cfg["seq_len"],
        shard_layout=layout,  # what the task given below deals (the config says what ran)
        learners=learners,
        tokens=j["tokens"],
        seed=j["seed"],
        eval_batches=cfg["eval_batches"],
        inner=InnerConfig(
            lr=j["inner_lr"],
            batch_size=j["per_learner_batch"],
            warmup_steps=10,
            optimizer=cfg.get("inner_optimizer", "adamw"),  # type: ignore[arg-type]  # one of INNER_OPTIMIZERS
        ),
        # data-parallel has no outer step: it ignores the algorithm
        algorithm=AlgorithmConfig() if method == "ddp" else algorithm(method, j["outer_lr"], cfg["sync_every"]),
    )
    result = run_sim(config, task=_TASKS[(j["size"], data)])
    return {
        **j,
        "eval_loss": result["eval_loss"],
        "goodput": result["goodput"],
        "outer_steps": result.get("outer_steps"),
        "wall_seconds": result["wall_seconds"],
    }


def _worker_init(threads: int, parent: int) -> None:
    torch.set_num_threads(threads)
    threading.Thread(target=_exit_with_parent, args=(parent,), daemon=True).start()


def _exit_with_parent(parent: int) -> None:
    """A worker ends when its parent is gone: a killed (kill -9) parent would leave it training."""
    while os.getppid() == parent:
        time.sleep(1.0)
    os._exit(1)


class Runner:
    """Runs jobs, each at most once: a job already in the results file is taken from it; every new one is
    written to the file as soon as it ends (atomically). `--jobs N` trains up to N independent jobs (one
    grid) at a time in worker processes, one per core; the results do not depend on N."""

    def __init__(self, cfg: dict, args: argparse.Namespace, rows: list[dict], tuning: list[dict] | None = None) -> None:
        self.cfg, self.args, self.rows = cfg, args, rows
        # each cell's bracketing, by (ratio, size, method), once done: what the grid of the table is
        self.tuning = {(t["ratio"], t["size"], t["method"]): t for t in tuning or []}
        self.done = {ident(r): r for r in rows}
        self.started = time.perf_counter()
        self.pool: ProcessPoolExecutor | None = None

    def __call__(self, j: dict) -> dict:
        return self.many([j])[0]

    def many(self, jobs: list[dict]) -> list[dict]:
        """The rows of `jobs`, in their order; those not in the file yet are trained (in parallel)."""
        todo = list({ident(j): j for j in jobs if ident(j) not in self.done}.values())
        if self.args.jobs > 1 and len(todo) > 1:
            if self.pool is None:
                self.pool = ProcessPoolExecutor(
                    self.args.jobs,
                    mp_context=mp.get_context("spawn"),
                    initializer=_worker_init,
                    initargs=(self.args.threads, os.getpid()),
                )
            futures = [self.pool.submit(train, self.cfg, self.args.data, j) for j in todo]
            for future in as_completed(futures):
                self._record(future.result())
        else:
            for j in todo:
                self._record(train(self.cfg, self.args.data, j))
        return [self.done[ident(j)] for j in jobs]

    def close(self) -> None:
        if self.pool is not None:
            self.pool.shutdown()

    def _record(self, row: dict) -> None:
        self.rows.append(row)
        self.done[ident(row)] = row
        print(
            f"[{len(self.rows)}] {row['ratio']:g} tok/param {row['size']} {row['method']} seed {row['seed']} lr "
            f"{row['inner_lr']:g}/{row['outer_lr']} G {row['global_batch']}: {row['eval_loss']:.4f} "
            f"({row['wall_seconds']:.1f} s)",
            file=sys.stderr,
            flush=True,
        )
        self.save()

    def save(self) -> None:
        wall = time.perf_counter() - self.started
        save(self.args.out, self.cfg, self.args.quick, self.args.data, self.rows, wall, list(self.tuning.values()))


def in_grid(rows: list[dict], cfg: dict, tuning: list[dict] | None = None) -> list[dict]:
    """The rows on the grid: the configured batches, and the rates a cell's bracketing tried (`tuning`)
    or, for a cell not bracketed yet (or a file from before the bracketing), the configured rates. Runs
    of an earlier, wider grid (G = 64 before the grid moved down) and of the edge probes stay in the
    results file but are not grid points now."""
    grids = {(t["ratio"], t["size"], t["method"]): t["grid"] for t in tuning or []}

    def on(r: dict) -> bool:
        rate = "inner_lr" if r["method"] == "ddp" else "outer_lr"
        rates = grids.get((r["ratio"], r["size"], r["method"]), {}).get(rate, cfg[rate + "s"])
        return r["global_batch"] in cfg["global_batches"] and r[rate] in rates

    return [r for r in rows if on(r)]


def table(rows: list[dict], cfg: dict, tuning: list[dict] | None) -> list[dict]:
    """`choose` on the grid's rows. With a bracketing on record (`tuning` not None), each cell says
    whether its rate is `bracketed` and whether it is `complete` (bracketed or given up on, every rate
    run at every batch; the fits leave out the others); without, the fits count grid points."""
    chosen = choose(in_grid(rows, cfg, tuning))
    if tuning is None:
        return chosen
    done = {(t["ratio"], t["size"], t["method"]): t for t in tuning}
    for c in chosen:
        t = done.get((c["ratio"], c["size"], c["method"]))
        rate = "inner_lr" if c["method"] == "ddp" else "outer_lr"
        c["bracketed"] = bool(t and t["bracketed"][rate])
        c["complete"] = bool(t) and c["grid_points"] == len(t["grid"][rate]) * len(cfg["global_batches"])
    return chosen


def save(
    path: Path, cfg: dict, quick: bool, data: str | None, rows: list[dict], wall: float, tuning: list[dict]
) -> None:
    grid = in_grid(rows, cfg, tuning)
    chosen = table(rows, cfg, tuning)
    report = {
        "quick": quick,
        "config": {
            **cfg,
            "data": data,
            "plan": {str(k): v for k, v in cfg["plan"].items()},
            "sizes": {s: SIZES[s] for s in SIZES},
        },
        "rows": rows,
        "tuning": tuning,
        "chosen": chosen,
        "fits": fits(chosen),
        "batch": batch_penalties(grid),
        "edges": edge_report(rows, cfg),
        "wall_seconds_this_session": wall,
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(json.dumps(report, indent=1, sort_keys=True) + "\n")
    os.replace(tmp, path)


def sweep(cfg: dict, run: Runner) -> None:
    """Every (ratio, size) of the plan, cheapest (parameters x tokens) first, so that an interrupted
    sweep holds the most complete sizes: data-parallel's grid, then the DiLoCo family's at data-parallel's
    best inner lr. The first ratio's two largest sizes then get the extra seeds at each method's best point."""
    seq = cfg["seq_len"]
    seed_ratio, first_sizes = next(iter(cfg["plan"].items()))
    seeded = sorted(first_sizes, key=lambda s: parameters(s, seq))[-2:]
    cells = sorted(
        ((ratio, size) for ratio, sizes in cfg["plan"].items() for size in sizes),
        key=lambda rs: rs[0] * parameters(rs[1], seq) ** 2,
    )
    for ratio, size in cells:
        bracket(cfg, run, ratio, size)
        if ratio == seed_ratio and size in seeded:
            tuning = list(run.tuning.values())
            mine = in_grid(run.rows, cfg, tuning)
            seed0 = [r for r in mine if r["ratio"] == ratio and r["size"] == size and r["seed"] == 0]
            run.many(
                [
                    job(cfg, ratio, size, c["method"], seed, c["inner_lr"], c["outer_lr"], c["global_batch"])
                    for c in choose(seed0)
                    for seed in cfg["extra_seeds"]
                ]
            )


def point(cfg: dict, ratio: float, size: str, method: str, rates: dict[str, float]) -> list[dict]:
    """One grid point's jobs (seed 0): its rates at every configured global batch."""
    inner, outer = rates["inner_lr"], rates.get("outer_lr")
    return [job(cfg, ratio, size, method, 0, inner, outer, g) for g in cfg["global_batches"]]


def bracket(cfg: dict, run: Runner, ratio: float, size: str) -> None:
    """One cell's rates bracketed (tuning.py), a rate's loss its best global batch: data-parallel's inner
    lr, then each DiLoCo method's outer lr at data-parallel's choice. The configured rates go first, in
    one batch of jobs (in parallel with --jobs); each widening's jobs after; all kept by the runner."""

    def loss(method: str, rates: dict[str, float]) -> float:
        return min(worst(r["eval_loss"]) for r in run.many(point(cfg, ratio, size, method, rates)))

    tuner = Tuner(loss, max_widenings=cfg.get("widenings", 4))
    inner_lr = Setting("inner_lr", cfg["inner_lrs"][0], start=tuple(cfg["inner_lrs"]))
    outer_lr = Setting("outer_lr", cfg["outer_lrs"][0], start=tuple(cfg["outer_lrs"]))
    run.many([j for lr in cfg["inner_lrs"] for j in point(cfg, ratio, size, "ddp", {"inner_lr": lr})])
    report = {"ddp": tuner.tune("ddp", [inner_lr])}
    inner = report["ddp"]["chosen"]["inner_lr"]
    family = [(m, {"inner_lr": inner, "outer_lr": olr}) for m in METHODS[1:] for olr in cfg["outer_lrs"]]
    run.many([j for m, rates in family for j in point(cfg, ratio, size, m, rates)])
    for method in METHODS[1:]:
        report[method] = tuner.tune(method, [outer_lr], fixed={"inner_lr": inner})
    for method, r in report.items():
        entry = {k: r[k] for k in ("grid", "chosen", "bracketed", "at_domain_edge")}
        run.tuning[(ratio, size, method)] = {"ratio": ratio, "size": size, "method": method, **entry}
    run.save()


def sweep_edges(cfg: dict, run: Runner) -> None:
    """The grid widened at its edges (`cfg["edges"]`) at a few cells, after the main sweep: data-parallel
    at the new batches, the DiLoCo family at every (outer lr, G) of the widened grid, at data-parallel's
    best inner lr of the main grid (runs already made are taken from the file)."""
    edges = cfg.get("edges") or {}
    batches = cfg["global_batches"] + edges.get("global_batches", [])
    outer = cfg["outer_lrs"] + edges.get("outer_lrs", [])
    for ratio, size in edges.get("cells", []):
        grid = [(lr, g) for lr in cfg["inner_lrs"] for g in cfg["global_batches"]]
        ddp = run.many([job(cfg, ratio, size, "ddp", 0, lr, None, g) for lr, g in grid])
        inner = min(ddp, key=lambda r: r["eval_loss"])["inner_lr"]
        run.many([job(cfg, ratio, size, "ddp", 0, lr, None, g) for lr in cfg["inner_lrs"] for g in batches])
        run.many([job(cfg, ratio, size, m, 0, inner, olr, g) for m in METHODS[1:] for olr in outer for g in batches])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="two tiny sizes, a 2 x 1 grid: 1-2 minutes")
    parser.add_argument("--json", action="store_true", help="end with one line of JSON (chosen settings and fits)")
    parser.add_argument("--out", type=Path, default=None, help="results file (resumed from if it exists)")
    parser.add_argument("--load", type=Path, default=None, help="print the table and fits of this results file")
    parser.add_argument("--data", default=None, help="training text (default: the Python standard library's source)")
    parser.add_argument("--threads", type=int, default=1, help="torch threads per job")
    parser.add_argument("--inner-optimizer", choices=INNER_OPTIMIZERS, default=InnerConfig().optimizer)
    parser.add_argument(
        "--shard-layout",
        choices=SHARD_LAYOUTS,
        default="interleaved",
        help="how the text is dealt to the learners (the package's default; scaling*.json were made contiguous)",
    )
    parser.add_argument(
        "--jobs", type=int, default=1, help="jobs trained at a time, in worker processes (one per core)"
    )
    args = parser.parse_args(argv)
    if args.load:
        report = json.loads(args.load.read_text())
        runs, every, cfg = len(report["rows"]), report["rows"], report.get("config", {})
        tuning = report.get("tuning")
        rows = in_grid(every, cfg, tuning) if "config" in report else every
    else:
        cfg = {
            **(QUICK if args.quick else FULL),
            "inner_optimizer": args.inner_optimizer,
            "shard_layout": args.shard_layout,
        }
        args.out = args.out or ROOT / "benchmarks" / "results" / (
            "scaling-quick.json" if args.quick else "scaling.json"
        )
        rows, tuning = [], None
        if args.out.exists():
            old = json.loads(args.out.read_text())
            made = {**BEFORE_0_4, **old["config"]}
            same = {k: made.get(k) for k in RESUME_KEYS} == {k: cfg[k] for k in RESUME_KEYS}
            if not same or old["config"].get("data") != args.data:
                parser.error(f"{args.out} holds runs of another configuration: give another --out")
            rows, tuning = old["rows"], old.get("tuning")
            print(f"resuming from {args.out}: {len(rows)} runs done", file=sys.stderr, flush=True)
        torch.set_num_threads(args.threads)
        if args.jobs < 1 or args.threads < 1:
            parser.error("--jobs and --threads take 1 or more")
        runner = Runner(cfg, args, rows, tuning)
        try:
            sweep(cfg, runner)
            sweep_edges(cfg, runner)
        finally:
            runner.close()
        runner.save()
        tuning = list(runner.tuning.values())
        runs, every, rows = len(rows), rows, in_grid(rows, cfg, tuning)
    chosen = table(every, cfg, tuning) if "inner_lrs" in cfg else choose(rows)
    fitted = fits(chosen)
    batch = batch_penalties(rows)
    edges = edge_report(every, cfg) if "inner_lrs" in cfg else []
    print_report(chosen, fitted)
    loose = [c for c in chosen if c.get("bracketed") is False]
    for c in loose:
        rate = "inner lr" if c["method"] == "ddp" else "outer lr"
        print(f"not bracketed: {c['ratio']:g} tok/param {c['size']} {c['method']}: {rate} on its grid's edge")
    print()
    print_batches(batch)
    if edges:
        print()
        print_edges(edges, cfg)
    if args.json:
        report = {"runs": runs, "chosen": chosen, "fits": fitted, "batch": batch, "edges": edges, "tuning": tuning}
        print(json.dumps(report, sort_keys=True))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
