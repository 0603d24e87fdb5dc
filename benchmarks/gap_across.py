"""Why the gap to data-parallel builds across rounds: an oracle outer step, and the round probed from
DiLoCo's own trajectory (issue #47, item 4).

`gap_why.py` found that from points of data-parallel's run one round of M = 4 learners x H = 16 steps,
at its best outer scale, buys as much loss as data-parallel's 16 steps on the same rows. Yet
synchronous DiLoCo ends +6.7 % above data-parallel at 84k (`gap.py`). Two measurements say where the
loss goes, both in gap.py's tuned baseline run (synchronous DiLoCo, M = 4, the same model, data,
tokens, schedule and seeds, run by the package's own virtual-clock cluster, `ddiloco.sim`):

1. The outer step, per variant (`VARIANTS`): `tuned` is gap.py's point (Nesterov, outer lr 0.7,
   momentum 0.5) and must give gap.py's loss; `oracle` takes, every round, theta <- theta - eta* delta
   with eta* the best of a bracketed line search (`gap_why.best_outer_lr`) on the loss of a few
   training batches drawn for it (never the eval batches), no momentum; `oracle_momentum` searches the
   scale of the Nesterov update (momentum 0.5) instead. The search replaces only the outer
   optimizer's learning rate at each merge (`RoundStep`): inner steps, merge and schedule are the
   sim's. In the `tuned` run the same search only looks (`searched`: the best scale per round, and
   what the rate taken costs against it). If the oracle closes most of the gap, the gap is the outer
   step's size across rounds; if not, it is in what the rounds start from.
2. In the `tuned` run, at 10 %, 50 % and 90 % of its rounds: the averaging penalty (the learners'
   mean eval loss after the round's H steps against the eval loss of their mean), and gap_why's probe
   from the new global model: the M learners with copies of their own inner optimizer states from
   the run take H steps each on rows of the same H batches data-parallel takes at batch B; data-
   parallel's optimizer is learner 0's state after --state-steps steps at batch B on other rows,
   parameters put back. Figures as gap_why's (`gap_why.figures`): cos, norm_ratio, efficiency.

Each run is saved as it ends (atomically) and a rerun skips it. Data-parallel's losses are gap.py's
(`benchmarks/results/gap.runs.json`, its tuned inner lr), or run here where that file lacks them.

    python benchmarks/gap_across.py --quick --json
    python benchmarks/gap_across.py --out benchmarks/results/gap-across.json --seeds 3 --json   # 84k: hours
"""

from __future__ import annotations

import argparse
import copy
import json
import math
import statistics
import sys
from collections.abc import Callable, Mapping
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from gap import ROOT, sim_config  # noqa: E402
from gap_why import AT, OUTER_LRS, best_outer_lr, figures, flat, join, probe, rows, steps  # noqa: E402
from scaling import gpt, parameters  # noqa: E402

from ddiloco.core.outer import NesterovOuterOptimizer  # noqa: E402
from ddiloco.sim.cluster import DecoupledCluster  # noqa: E402
from ddiloco.sim.run import run_sim  # noqa: E402
from ddiloco.train.corpus import encoded_corpus  # noqa: E402
from ddiloco.train.inner import make_inner_optimizer  # noqa: E402
from ddiloco.train.streams import Batch  # noqa: E402
from ddiloco.train.tasks import LanguageModelTask  # noqa: E402

#: gap.py's tuned point at 84k (bracketed, seed 0): DiLoCo's and data-parallel's inner lr, the outer step.
TUNED = {"inner_lr": 0.003, "outer_lr": 0.7, "outer_momentum": 0.5}
FULL = dict(
    sizes=["84k"],
    ratio=20.0,
    seq_len=64,
    sync_every=16,
    global_batch=16,
    eval_batches=20,
    seeds=3,
    search_batches=4,
    state_steps=50,
    split="iid",
)
QUICK = dict(FULL, sizes=["12k"], ratio=4.0, seq_len=32, sync_every=8, global_batch=8, eval_batches=4, seeds=1)
VARIANTS = ("tuned", "oracle", "oracle_momentum")
METHOD = "diloco-m4"
M = 4
#: the widest scales `best_outer_lr` reaches (6 widenings by 1.4): a choice on one is not bracketed
EDGES = (min(OUTER_LRS) / 1.4**6 * 1.01, max(OUTER_LRS) * 1.4**6 * 0.99)  # (their 4-digit roundings inside)
RUN_KEYS = ("ratio", "seq_len", "sync_every", "global_batch", "eval_batches", "search_batches", "state_steps", "split")


def say(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def load(model: torch.nn.Module, values: Mapping[str, torch.Tensor]) -> None:
    """Set `model`'s parameters by name (the synchronizer's global tensors are keyed so)."""
    with torch.no_grad():
        for name, p in model.named_parameters():
            p.copy_(values[name])


class RoundStep(NesterovOuterOptimizer):
    """The package's outer step with a look at every round: `before(round, params, scaled)` as the merge
    comes in (the learners still hold their own parameters), then, with `search`, the step's learning
    rate chosen as the best scale of this round's update (`gap_why.best_outer_lr` over `search(round,
    candidate)`), then the step itself (`NesterovOuterOptimizer.apply`), then `after(round, params)`.
    With `take` False the search only looks: the step keeps its rate, and `searched` says per round how
    far the best scale was and what the rate taken cost on the search's loss against it."""

    def __init__(
        self,
        lr: float,
        momentum: float,
        search: Callable[[int, dict[str, torch.Tensor]], float] | None = None,
        before: Callable[[int, Mapping[str, torch.Tensor], Mapping], None] | None = None,
        after: Callable[[int, Mapping[str, torch.Tensor]], None] | None = None,
    ) -> None:
        super().__init__(lr, momentum)
        self.search, self.before, self.after = search, before, after
        self.take = True
        self.rounds = 0
        self.chosen: list[float] = []  # the rates taken by the search
        self.searched: list[dict[str, float]] = []  # per round: the best scale, its loss, the taken rate's

    def apply(
        self,
        params: Mapping[str, torch.Tensor],
        scaled: Mapping[str, tuple[torch.Tensor, float]],
        use_momentum: bool = True,
        contributions: int = 1,
    ) -> None:
        self.rounds += 1
        if self.before is not None:
            self.before(self.rounds, params, scaled)
        if self.search is not None:
            u = self.update(scaled, use_momentum, contributions)
            search = self.search

            def loss_at(eta: float) -> float:
                return search(self.rounds, {n: params[n] - eta * u.get(n, 0.0) for n in params})

            eta, best = best_outer_lr(loss_at)
            if self.take:
                self.lr = eta
                self.chosen.append(eta)
            taken = best if self.take else loss_at(self.lr)
            self.searched.append({"eta": eta, "loss_best": best, "loss_taken": taken, "lr": self.lr})
        super().apply(params, scaled, use_momentum, contributions)
        if self.after is not None:
            self.after(self.rounds, params)


class Across:
    """The runs of one size and seed: each variant of the outer step, the probes in the tuned one."""

    def __init__(self, cfg: dict, task: LanguageModelTask, size: str, seed: int) -> None:
        self.cfg, self.task, self.size, self.seed = cfg, task, size, seed
        self.config = sim_config(cfg, size, METHOD, {**TUNED, "seed": float(seed)}, {})
        tokens = cfg["ratio"] * parameters(size, cfg["seq_len"])
        self.rounds = int(tokens // (cfg["global_batch"] * cfg["seq_len"])) // cfg["sync_every"]
        self.marks = {max(1, round(a * self.rounds)): a for a in AT}
        self.search_stream = task.stream(0, 1, cfg["global_batch"], seed + 2000)  # training rows, not eval
        self.probe_stream = task.stream(0, 1, cfg["global_batch"], seed + 1000)

    def run(self, variant: str) -> dict:
        """One run of `variant` on the package's cluster (as `run_sim`), its outer step a `RoundStep`."""
        torch.manual_seed(self.config.seed)  # as run_sim
        cluster = DecoupledCluster(self.config, self.task)
        scratch = copy.deepcopy(cluster.eval_model)
        points: list[dict] = []
        momentum = 0.0 if variant == "oracle" else TUNED["outer_momentum"]
        step = RoundStep(TUNED["outer_lr"], momentum)
        step.search = lambda r, values: self.search_loss(scratch, r, values)
        if variant == "tuned":  # the probes and the search only read the run, on copies
            step.take = False
            step.before = lambda r, params, scaled: self.penalty(cluster, scratch, r, points)
            step.after = lambda r, params: self.probe(cluster, scratch, r, params, points)
        cluster.sync.state.outer[0] = step  # synchronous DiLoCo: one fragment
        stats = cluster.run()
        loss = self.task.evaluate(cluster.global_model(), max_batches=self.config.eval_batches)["eval_loss"]
        out = {"size": self.size, "seed": self.seed, "variant": variant, "eval_loss": loss}
        out |= {"outer_steps": stats["outer_steps"], "chosen": step.chosen, "points": points, "searched": step.searched}
        return out

    def search_loss(self, model: torch.nn.Module, r: int, values: Mapping[str, torch.Tensor]) -> float:
        """The oracle's objective: mean loss on this round's own training batches (never eval rows)."""
        load(model, values)
        n = self.cfg["search_batches"]
        model.eval()
        with torch.no_grad():
            losses = [float(self.task.loss(model, self.search_stream.batch_at(r * n + i))) for i in range(n)]
        return statistics.fmean(losses)

    def eval_loss(self, model: torch.nn.Module, values: Mapping[str, torch.Tensor]) -> float:
        load(model, values)
        return self.task.evaluate(model, max_batches=self.cfg["eval_batches"])["eval_loss"]

    def penalty(self, cluster: DecoupledCluster, scratch: torch.nn.Module, r: int, points: list[dict]) -> None:
        """At a marked round, before its merge: each learner's eval loss after its H steps, and that of
        their mean."""
        if r not in self.marks:
            return
        learners = [{n: p.detach().clone() for n, p in lr.model.named_parameters()} for lr in cluster.learners]
        own = [self.eval_loss(scratch, values) for values in learners]
        mean = {n: torch.stack([values[n] for values in learners]).mean(0) for n in learners[0]}
        mean_loss = self.eval_loss(scratch, mean)
        points.append({"at": self.marks[r], "round": r, "loss_learners": own, "loss_mean_of_learners": mean_loss})
        points[-1]["penalty"] = mean_loss - statistics.fmean(own)

    def probe(
        self,
        cluster: DecoupledCluster,
        scratch: torch.nn.Module,
        r: int,
        params: Mapping[str, torch.Tensor],
        points: list[dict],
    ) -> None:
        """At a marked round, after its outer step: gap_why's probe from the new global model, the
        learners with copies of their own optimizers, data-parallel's with learner 0's state built at
        batch B (--state-steps steps on other rows, parameters put back)."""
        if r not in self.marks:
            return
        cfg, task = self.cfg, self.task
        h = cfg["sync_every"]
        load(scratch, params)
        theta0 = flat(scratch)
        batches = self.rows_of(r * 997, h)
        state_rows = [self.probe_stream.batch_at(10**7 + r * 997 + i) for i in range(cfg["state_steps"])]
        dp_model, dp_opt = self.twin(scratch, cluster.learners[0].optimizer)
        steps(task, dp_model, dp_opt, state_rows)
        load(dp_model, params)
        # gap_why's own probe from this point: learners' states built from data-parallel's (one variable
        # apart from the run's own learner states, which the figures below use)
        built = probe(task, dp_model, dp_opt, batches, state_rows, M, cfg["eval_batches"], self.config.inner)
        steps(task, dp_model, dp_opt, batches)
        delta_dp = theta0 - flat(dp_model)
        deltas = []
        for m, learner in enumerate(cluster.learners):
            lm, lo = self.twin(scratch, learner.optimizer)
            steps(task, lm, lo, [rows(batch, m, M) for batch in batches])
            deltas.append(theta0 - flat(lm))
        point = figures(task, scratch, delta_dp, deltas, cfg["eval_batches"])
        for figs in (point, built):
            figs["efficiency"] = figs["gain_round"] / figs["gain_dp"] if figs["gain_dp"] > 0 else math.nan
        point["built"] = built
        (entry,) = [p for p in points if p["round"] == r]  # its penalty, taken before the step
        entry.update(point)
        say(
            f"{self.size} seed {self.seed} round {r} ({entry['at']:.0%}): penalty {entry['penalty']:+.4f}  "
            f"cos {point['cos']:.3f}  norm {point['norm_ratio']:.2f}  efficiency {point['efficiency']:.2f} "
            f"(learners' states built as gap_why's: {built['efficiency']:.2f})"
        )

    def twin(self, model: torch.nn.Module, opt: torch.optim.Optimizer) -> tuple[torch.nn.Module, torch.optim.Optimizer]:
        """A copy of `model` and an optimizer over it holding a copy of `opt`'s state and rate."""
        twin = copy.deepcopy(model)
        twin_opt = make_inner_optimizer(twin, self.config.inner)
        twin_opt.load_state_dict(copy.deepcopy(opt.state_dict()))
        return twin, twin_opt

    def rows_of(self, index: int, count: int) -> list[Batch]:
        """`count` batches of B rows from `index` on: iid from the whole corpus, or (shards) learner m's
        rows from its own contiguous shard of the training text, as in the run."""
        if self.cfg["split"] == "iid":
            return [self.probe_stream.batch_at(index + i) for i in range(count)]
        b = self.cfg["global_batch"]
        streams = [self.task.stream(m, M, b // M, self.seed + 1000) for m in range(M)]
        return [join([s.batch_at(index + i) for s in streams]) for i in range(count)]


def dp_losses(cfg: dict, size: str, seeds: list[int], task: LanguageModelTask) -> dict[int, float]:
    """Data-parallel's final eval loss per seed at the tuned inner lr: gap.py's runs where its runs file
    holds them for this model, budget and data, else run here (`gap.sim_config`, as gap.py runs it)."""
    path = ROOT / "benchmarks" / "results" / "gap.runs.json"
    saved = json.loads(path.read_text()) if path.is_file() else {}
    context = {k: cfg[k] for k in ("ratio", "seq_len", "sync_every", "global_batch", "eval_batches")} | {"data": None}
    found: dict[int, float] = {}
    if saved.get("context") == context:
        for e in saved["evaluations"]:
            s = e["settings"]
            if e["method"] == f"{size}/ddp/" and s.get("inner_lr") == TUNED["inner_lr"] and int(s["seed"]) in seeds:
                found[int(s["seed"])] = float(e["loss"])
    for seed in seeds:
        if seed not in found:
            config = sim_config(cfg, size, "ddp", {"inner_lr": TUNED["inner_lr"], "seed": float(seed)}, {})
            found[seed] = float(run_sim(config, task=task)["eval_loss"])
    return found


def summarize(runs: list[dict], ddp: dict[str, dict[int, float]]) -> dict:
    """Per size and variant: the losses and gaps by seed, the oracle's chosen scales; per size, the
    probe points of the tuned runs and their efficiency (summed gains over summed gains, as gap_why)."""
    out: dict = {"variants": [], "points": [], "probe": []}
    for size in sorted({r["size"] for r in runs}, key=lambda s: parameters(s, 64)):
        tuned_gap = None
        for variant in VARIANTS:
            rs = sorted((r for r in runs if r["size"] == size and r["variant"] == variant), key=lambda r: r["seed"])
            if not rs:
                continue
            gaps = [100.0 * (r["eval_loss"] / ddp[size][r["seed"]] - 1.0) for r in rs]
            row = {"size": size, "variant": variant, "seeds": [r["seed"] for r in rs]}
            row |= {"eval_loss": [r["eval_loss"] for r in rs], "ddp_loss": [ddp[size][r["seed"]] for r in rs]}
            row |= {"gap_pct": gaps, "gap_pct_mean": statistics.fmean(gaps)}
            row["gap_pct_se"] = statistics.stdev(gaps) / math.sqrt(len(gaps)) if len(gaps) > 1 else math.nan
            chosen = [eta for r in rs for eta in r["chosen"]]
            if chosen:
                row |= {"eta_min": min(chosen), "eta_median": statistics.median(chosen), "eta_max": max(chosen)}
                row["eta_at_edge"] = sum(1 for eta in chosen if not EDGES[0] < eta < EDGES[1])  # not bracketed
                row["rounds"] = len(chosen)
            searched = [x for r in rs for x in r.get("searched", [])]
            if searched:  # the step taken against the best scale of the search's loss, round by round
                row["search_eta_median"] = statistics.median(x["eta"] for x in searched)
                row["longer_than_best"] = statistics.fmean(x["lr"] > x["eta"] for x in searched)
                costs = [x["loss_taken"] - x["loss_best"] for x in searched]
                row["immediate_cost_mean"], row["immediate_cost_median"] = (
                    statistics.fmean(costs),
                    statistics.median(costs),
                )
            if variant == "tuned":
                tuned_gap = row["gap_pct_mean"]
            elif tuned_gap is not None and rs:
                same = [100.0 * (t["eval_loss"] / ddp[size][t["seed"]] - 1.0) for t in runs
                        if t["size"] == size and t["variant"] == "tuned" and t["seed"] in row["seeds"]]  # fmt: skip
                if len(same) == len(gaps):
                    row["gap_closed"] = 1.0 - statistics.fmean(gaps) / statistics.fmean(same)
            out["variants"].append(row)
        tuned = [r for r in runs if r["size"] == size and r["variant"] == "tuned"]
        points = [{"size": size, "seed": r["seed"], **p} for r in tuned for p in r["points"]]
        out["points"] += points
        for at in [*sorted({p["at"] for p in points}), "all"]:
            ps = [p for p in points if at in (p["at"], "all") and "cos" in p]
            if not ps:
                continue
            gain_dp = sum(p["gain_dp"] for p in ps)
            row = {"size": size, "at": at, "n": len(ps)}
            for key in ("cos", "norm_ratio", "learner_cos", "outer_lr", "dp_outer_lr", "penalty"):
                row[key] = statistics.fmean(p[key] for p in ps)
            row["efficiency"] = sum(p["gain_round"] for p in ps) / gain_dp if gain_dp > 0 else math.nan
            built_dp = sum(p["built"]["gain_dp"] for p in ps)
            row["built_efficiency"] = sum(p["built"]["gain_round"] for p in ps) / built_dp if built_dp > 0 else math.nan
            row["built_cos"] = statistics.fmean(p["built"]["cos"] for p in ps)
            row["built_learner_cos"] = statistics.fmean(p["built"]["learner_cos"] for p in ps)
            out["probe"].append(row)
    return out


def show(summary: dict) -> None:
    for r in summary["variants"]:
        etas = (
            f"  eta* {r['eta_min']:.2f} / {r['eta_median']:.2f} / {r['eta_max']:.2f} ({r['eta_at_edge']} of "
            f"{r['rounds']} unbracketed)"
            if "eta_min" in r
            else ""
        )
        closed = f"  closes {r['gap_closed']:.0%} of tuned's gap" if "gap_closed" in r else ""
        if r["variant"] == "tuned" and "search_eta_median" in r:
            closed += (
                f"  best scale of its update on the search's loss: median {r['search_eta_median']:.2f} "
                f"(the rate taken longer in {r['longer_than_best']:.0%} of rounds; its loss there above the best's by "
                f"{r['immediate_cost_median']:.4f} median, {r['immediate_cost_mean']:.4f} mean)"
            )
        say(
            f"{r['size']:>5} {r['variant']:<16} loss {statistics.fmean(r['eval_loss']):.4f}  gap "
            f"{r['gap_pct_mean']:+.2f} % ({', '.join(f'{g:+.2f}' for g in r['gap_pct'])}){etas}{closed}"
        )
    for r in summary["probe"]:
        where = r["at"] if r["at"] == "all" else format(r["at"], ".0%")
        say(
            f"{r['size']:>5} at {where}: cos {r['cos']:.3f}  norm {r['norm_ratio']:.2f}  learners "
            f"{r['learner_cos']:.2f}  efficiency {r['efficiency']:.2f} (states built as gap_why's: "
            f"{r['built_efficiency']:.2f})  averaging penalty {r['penalty']:+.4f}"
        )


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true", help="a tiny GPT at 4 tokens per parameter: seconds")
    p.add_argument("--json", action="store_true", help="end with one JSON line: the summary and the runs")
    p.add_argument("--out", type=Path, default=None, help="results file: each run saved as it ends, resumed from")
    p.add_argument("--sizes", nargs="+", default=None)
    p.add_argument("--seeds", type=int, default=None, help="seeds 0 .. N-1")
    p.add_argument("--variants", nargs="+", choices=VARIANTS, default=list(VARIANTS))
    p.add_argument("--data", default=None, help="a text file (default: the package's bundled corpus)")
    p.add_argument("--state-steps", type=int, default=None, help="steps that give data-parallel's probe state")
    p.add_argument("--search-batches", type=int, default=None, help="training batches of the oracle's search")
    p.add_argument("--split", choices=("iid", "shards"), default="iid", help="the probe's rows (gap_why's --split)")
    args = p.parse_args(argv)
    cfg = dict(QUICK if args.quick else FULL)
    cfg["sizes"] = args.sizes or cfg["sizes"]
    cfg["seeds"] = args.seeds or cfg["seeds"]
    cfg["state_steps"] = cfg["state_steps"] if args.state_steps is None else args.state_steps
    cfg["split"] = args.split
    cfg["search_batches"] = args.search_batches or cfg["search_batches"]
    torch.set_num_threads(1)
    context = {k: cfg[k] for k in RUN_KEYS} | {"data": args.data, "tuned": TUNED}
    saved = json.loads(args.out.read_text()) if args.out and args.out.is_file() else {}
    runs: list[dict] = saved.get("runs", []) if saved.get("context") == context else []
    ddp: dict[str, dict[int, float]] = {}
    for size in cfg["sizes"]:
        corpus = encoded_corpus(args.data and Path(args.data), "byte", 1024, 0.1)
        task = LanguageModelTask("gpt", gpt(size, cfg["seq_len"]), corpus, "contiguous")  # as gap.json's runs
        ddp[size] = dp_losses(cfg, size, list(range(cfg["seeds"])), task) if args.data is None else {}
        for seed in range(cfg["seeds"]):
            if args.data is not None:
                ddp[size] |= {seed: float(run_sim(sim_config(cfg, size, "ddp", {**TUNED, "seed": float(seed)}, {}),
                                                  task=task)["eval_loss"])}  # fmt: skip
            across = Across(cfg, task, size, seed)
            for variant in args.variants:
                if any(r["size"] == size and r["seed"] == seed and r["variant"] == variant for r in runs):
                    continue
                say(f"{size} seed {seed} {variant}: {across.rounds} rounds")
                runs.append(across.run(variant))
                say(f"{size} seed {seed} {variant}: eval loss {runs[-1]['eval_loss']:.4f}")
                if args.out:
                    args.out.parent.mkdir(parents=True, exist_ok=True)
                    tmp = args.out.with_suffix(".tmp")
                    tmp.write_text(json.dumps({"context": context, "runs": runs}, indent=1) + "\n")
                    tmp.replace(args.out)
    wanted = [
        r for r in runs if r["size"] in cfg["sizes"] and r["seed"] < cfg["seeds"] and r["variant"] in args.variants
    ]
    summary = summarize(wanted, ddp)
    show(summary)
    if args.json:
        print(json.dumps({"summary": summary, "ddp": ddp, "runs": wanted, "config": cfg}, sort_keys=True))
    return 0


if __name__ == "__main__":
    sys.exit(main())
