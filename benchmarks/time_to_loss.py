"""Time to loss: does Decoupled DiLoCo reach a given loss sooner, in wall-clock seconds, than what users
run today? Loss against wall time for data-parallel (`ddp`), elastic data-parallel (`elastic-ddp`),
synchronous DiLoCo (`diloco`), Streaming DiLoCo (`streaming`: fragments and overlap, every learner
in every round) and Decoupled DiLoCo (`decoupled`), real processes via `ddiloco run`, in four
scenarios, each also run on the virtual clock (`ddiloco sim`) to say how far the two agree. The best
synchronous rival (`best_synchronous`) is whichever of diloco and streaming ends at the lower loss.

All five methods train the same model on the same data shards with the same inner optimizer
(--inner-optimizer: Muon by default, AdamW on request), token budget,
step pad (--min-step-seconds: each learner behaves like its own accelerator) and failure trace
(one CSV, replayed to every method with --chaos-trace, offsets from each run's launch; on Slurm one
schedule of requeues, offsets from each run's submission):

    one_site        one site; a learner killed (kill -9) about once a minute, back after 15 s
    cross_site      four sites on a cross-region link, scaled to the model (`cross_site_link`): bytes per
                    step over bandwidth x step time as for a 1B-parameter model with 1 s steps on
                    1 Gbit/s links, 35 ms one way (latency scaled by the step time too)
    mixed_hardware  learner 2 is 2x slower, learner 3 1.3x (DDILOCO_STEP_SLOWDOWN stretches their pad)
    preemptible     preemptions with requeue waits, one every 60 s. On Slurm for all four methods
                    (--preemptible-backend slurm, the default when a cluster is reachable or a private
                    one starts, time_to_loss_slurm.py): every run is `ddiloco run --backend slurm`,
                    its learner (worker) jobs requeued and held (`scontrol requeuehold`) on one
                    schedule from its submission, released after the requeue wait (30 s). On the
                    local backend (--preemptible-backend local, or no Slurm; the note says so): kill
                    -9, back after 30 s

--quick scales the budget down and the failure clock with it (kills 6x as often, outages 6x shorter).
Every run is capped at --cap times the time the budget takes without failures or waits (a run that
reaches the cap stops there: `--duration`; its schedule decays over the cap, as for a time budget).

Every method is tuned the same way, on the virtual clock without failures at the scenarios' budget
and model size, by the bracketing tuner of benchmarks/tuning.py (lowest final eval loss): the inner
lr of every method (elastic-ddp takes ddp's: it is the same optimisation), then for the DiLoCo
family the outer lr at that inner lr, then the outer momentum at both.
The lrs start from 3 points a factor 2 apart around the optimizer's default lr (inner;
train.inner.DEFAULT_LR: Muon 0.012, AdamW 0.003) and 0.7 (outer), the momentum from
0.3, 0.5, 0.7 (steps of 0.2 in [0, 0.95]); while the best sits on an edge, the grid gets one more
point past it (at most 4 times). The chosen values go to the real runs and the scenarios' virtual
clock runs alike. The JSON's `tuning` holds every method's grid, choice, and whether the choice is
strictly inside its grid (`bracketed`; one at the domain's edge, e.g. momentum 0, cannot be).
Every tuning run is saved in the run directory's tuning.json (or --tuning FILE): a rerun with the same
--run-dir (or file) resumes. --tune-only: tune, print the JSON line (with --json) and stop. --no-sweep: no tuning, every
method at --inner-lr and the default outer lr and momentum.

Per scenario it prints the wall seconds each method needs to reach the best baseline's final loss
(to within --tolerance, 0.01: at equal tokens the methods end within hundredths of each other; the
strict figure is in the JSON), the first crossing of its eval-loss curve, linear between
evaluations; each method's loss at the wall time the first of them finished; goodput and final eval
loss; and the same seconds on the virtual clock. Wall seconds count from the run's training window
(its first learner joined, or its first data-parallel generation formed): the seconds of process
start-up before it are the same fixed cost for every method and nothing next to a real run's hours
(they are in the JSON as startup_seconds). Plots of loss against wall time go to the run directory.

Seeds (--seeds 0 1 2; the claims are made on 3): every scenario runs once per seed (its failure trace
and data order drawn from it), each seed against its own target; the tables and the JSON's `rows`
give each method's mean +- standard deviation and every seed's seconds (`per_seed` holds each seed's
whole result), the aim judged on the means and per seed. The settings are tuned once, at the first
seed. Each seed's scenario is saved as it ends (RUN_DIR/seed-N/SCENARIO.json), and each real run
within it (its folder's real-result.json, with its flags, failure trace and reruns; with --reals DIR
in that folder too, which outlives the run directory): a rerun with the same --run-dir and settings
resumes, a run cut short made again from scratch. A quiet machine
(benchmarks/runs.py): a real run during which other processes used more than 10 % of the CPU is
redone (--reruns, default 1), then kept but left out of its method's means (`left_out`); every row
says `quiet` and `others_cpu_share`. The virtual-clock runs do not depend on the load: `--sims-only`
makes them all (every scenario and seed) beside other work, and the real runs read them back (each
kept with its flags and failure trace in its directory, or with --sims DIR in a folder that outlives
the run directory: a fresh machine given the same --run-dir reads them from there).

    python benchmarks/time_to_loss.py --quick --json   # all four scenarios, smaller
    python benchmarks/time_to_loss.py --scenarios cross_site mixed_hardware
    python benchmarks/time_to_loss.py --quick --tune-only --json --run-dir runs/ttl  # tuning alone
    python benchmarks/time_to_loss.py --quick --tune-only --run-dir runs/ttl --tune-first decoupled  # a 2nd core
    python benchmarks/time_to_loss.py --quick --sims-only --seeds 0 1 2 --run-dir runs/ttl  # beside other work
    python benchmarks/time_to_loss.py --quick --sims-only --seeds 1 2 --seed 0 --run-dir runs/ttl  # a 2nd core
    python benchmarks/time_to_loss.py --sims-only --seeds 0 1 2 --run-dir runs/ttl-full \
        --tuning benchmarks/results/time-to-loss-full-muon.tuning.json \
        --sims benchmarks/results/time-to-loss-full-muon.sims   # results that outlive the run directory
    flock /tmp/cpu.lock python benchmarks/time_to_loss.py --seeds 0 1 2 --run-dir runs/ttl-full --json \
        --tuning benchmarks/results/time-to-loss-full-muon.tuning.json \
        --sims benchmarks/results/time-to-loss-full-muon.sims --reals benchmarks/results/time-to-loss-full-muon.reals
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import json
import math
import os
import shutil
import statistics
import sys
import time
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path

from chaos_slurm import schedule
from runs import ROOT, ddiloco_run, parse_run_arguments
from time_to_loss_curves import eval_batches, loss_at, read_curve, seconds_to_target, sim_run, window
from time_to_loss_seeds import across_seeds, show_seeds
from time_to_loss_show import console, plot, show
from time_to_loss_slurm import preempted_run, slurm_or_local
from tuning import DATA_PARALLEL, DILOCO_FAMILY, INNER_LR, Tuner

from ddiloco.chaos.injector import ChaosSettings, learner_trace
from ddiloco.chaos.trace import FailureTrace, Outage
from ddiloco.train.device import STEP_SLOWDOWN_ENV
from ddiloco.train.inner import DEFAULT_LR, INNER_OPTIMIZERS, InnerConfig  # noqa: E402
from ddiloco.train.streams import SHARD_LAYOUTS  # noqa: E402

SCENARIOS = ("one_site", "cross_site", "mixed_hardware", "preemptible")
METHODS = ("ddp", "elastic-ddp", "diloco", "streaming", "decoupled")
BASELINES = METHODS[:4]
SYNCHRONOUS = ("diloco", "streaming")  # the synchronous DiLoCo rivals
FAMILY = ("diloco", "streaming", "decoupled")  # with an outer step: outer lr and momentum tuned too
SOONER = "decoupled reaches the target sooner than elastic-ddp"
HALF = "decoupled reaches the target in at most half the best baseline's time"
AIMS = {"one_site": SOONER, "preemptible": SOONER, "cross_site": HALF, "mixed_hardware": HALF}
REAL = {"params": 1e9, "step_seconds": 1.0, "gbit_per_s": 1.0, "latency_ms": 35.0}


@dataclass
class Scenario:
    name: str
    trace: Path | None = None  # the failure trace, replayed to every method
    link: tuple[float, float] | None = None  # (one-way ms, MB/s each way) of every learner's link
    slowdown: tuple[float, ...] | None = None
    note: str = ""
    aim: str = ""
    extra: dict = field(default_factory=dict)
    slurm: dict | None = None  # the Slurm commands' environment: run on Slurm, preempted on `requeues`
    requeues: list[tuple[float, int]] = field(default_factory=list)


def cross_site_link(params: int, step_seconds: float) -> tuple[float, float, dict]:
    """(latency ms, bandwidth MB/s) that give this model the bytes-to-compute ratio of a 1B-parameter
    model with 1 s steps on 1 Gbit/s: bandwidth scales with the parameters (bytes per step) and
    inversely with the step time; the latency with the step time."""
    scale = (params / REAL["params"]) * (REAL["step_seconds"] / step_seconds)
    bandwidth = REAL["gbit_per_s"] * 1e9 / 8 * scale  # bytes per second
    latency = REAL["latency_ms"] * step_seconds / REAL["step_seconds"]
    return latency, bandwidth / 1e6, {**REAL, "bandwidth_scale": scale, "latency_ms_scaled": latency}


def scenarios(args: argparse.Namespace, base: Path, params: int, slurm: tuple[dict | None, str]) -> list[Scenario]:
    """The scenarios asked for; `slurm`: (environment or None, why) of the preemptible scenario's backend."""
    m, speed = args.learners, args.failure_speedup
    base.mkdir(parents=True, exist_ok=True)  # the traces are written here (one folder per seed)
    out = []
    for name in args.scenarios:
        sc = Scenario(name)
        if name in ("one_site", "preemptible"):
            every, down = (60.0, 15.0) if name == "one_site" else (60.0, 30.0)  # job-wide, at full scale
            chaos = ChaosSettings(learner_mtbf=m * every / speed, learner_down=down / speed, seed=args.seed)
            sc.trace = base / f"{name}-trace.csv"
            learner_trace(chaos, m, horizon=4 * 3600.0).save(sc.trace)
            sc.extra = {"kill_every_s": every / speed, "down_s": down / speed}
            sc.aim = AIMS[name]
        if name == "preemptible":
            sc.slurm, sc.note = slurm
            if sc.slurm is not None:  # the same rate per learner, as requeues from each run's submission
                sc.requeues = schedule(m, m * every / speed, args.cap_seconds, args.seed)
                outages = [Outage(t, learner, t + down / speed) for t, learner in sc.requeues]
                FailureTrace.of(outages).save(sc.trace)  # the virtual clock's stand-in: down for the nominal wait
                sc.extra = {**sc.extra, "backend": "slurm", "requeues_scheduled": len(sc.requeues)}
        if name == "cross_site":
            latency, bandwidth, scaling = cross_site_link(params, args.min_step_seconds)
            sc.link, sc.extra = (latency, bandwidth), scaling
        if name == "mixed_hardware":
            sc.slowdown = tuple([1.0] * (m - 2) + [2.0, 1.3])
        if name in ("cross_site", "mixed_hardware"):
            sc.aim = AIMS[name]
        out.append(sc)
    return out


def run_real(args: argparse.Namespace, sc: Scenario, method: str, tuned: dict[str, float], run_dir: Path) -> dict:
    flags = ["--method", method, "--learners", str(args.learners), "--model-size", args.model_size]
    flags += ["--data", str(args.data), "--seq-len", str(args.seq_len), "--batch-size", str(args.batch_size)]
    flags += ["--inner-optimizer", args.inner_optimizer]
    flags += ["--tokens", str(args.tokens), "--duration", f"{args.cap_seconds:.1f}", "--seed", str(args.seed)]
    flags += ["--min-step-seconds", str(args.min_step_seconds), *tuned_flags(tuned), "--no-dashboard"]
    flags += ["--eval-every", str(args.eval_every), "--eval-batches", str(args.eval_batches)]
    if method in ("ddp", "elastic-ddp"):  # the gradients' all-reduce, through the same emulated link
        flags += ["--allreduce-precision", args.allreduce_precision]
    if sc.trace is not None and sc.slurm is None:  # on Slurm, requeues instead (`preempted_run`)
        flags += ["--chaos-trace", str(sc.trace)]
    if sc.link is not None:
        flags += ["--net-latency", f"{sc.link[0]:.4g}", "--net-bandwidth", f"{sc.link[1]:.6g}"]
    what = f"{sc.name} / {method} / seed {args.seed}"
    if sc.slurm is not None:  # every job on this machine's cores: shared as the local launcher shares them
        flags += ["--threads", str(max(1, (os.cpu_count() or 1) // (args.learners + 1)))]
    key = _real_key(flags, sc, args.reruns)
    kept = real_kept(args, run_dir)
    found = saved_result(run_dir / "real-result.json", key)
    if found is None and kept is not None:
        found = saved_result(kept, key)
    if found is not None:  # a full-size pass spans sessions: a run that ended is not made again
        console.print(f"{what}: done before, read back")
        if kept is not None and saved_result(kept, key) is None:
            save_result(kept, key, found)  # kept where it outlives the run directory
        return found
    console.print(f"[bold]{what}[/bold]: ddiloco run {' '.join(flags)}")
    # a run cut short (its process ended with the session) left its checkpoints: the synchronizers
    # would resume from them, so its folders go before it is made again
    for stale in [run_dir, *run_dir.parent.glob(f"{run_dir.name}-rerun*")]:
        shutil.rmtree(stale, ignore_errors=True)
    for attempt in range(args.reruns + 1):  # a run made beside other work is redone, then left out
        attempt_dir = run_dir if attempt == 0 else run_dir.with_name(f"{run_dir.name}-rerun{attempt}")
        summary = one_real_run(args, sc, flags, attempt_dir, what)
        load = summary.get("load", {})
        if load.get("quiet") is not False:
            break
        later = "rerun" if attempt < args.reruns else "left out of the means across seeds"
        console.print(f"{what}: other processes used {load['others_cpu_share']:.0%} of the CPU meanwhile: {later}")
    span = window(attempt_dir, summary)
    curve = read_curve(attempt_dir, span)
    result = {
        "summary": summary,
        "curve": curve,
        "finish": span[1] - span[0],
        "start": span[0],
        "eval_batches": eval_batches(attempt_dir),
        "quiet": summary.get("load", {}).get("quiet"),  # None on Slurm: its jobs are not this process's children
        "others_cpu_share": summary.get("load", {}).get("others_cpu_share"),
        "attempts": attempt + 1,
    }
    if kept is not None:
        save_result(kept, key, result)
    return save_result(run_dir / "real-result.json", key, result)


def real_kept(args: argparse.Namespace, run_dir: Path) -> Path | None:
    """Where the real run RUN_DIR (BASE/seed-N/SCENARIO/METHOD) is kept besides its run directory: with
    --reals DIR at DIR/seed-N/SCENARIO/METHOD.json, a folder that can outlive the run directory (the
    runs of a full-size pass take several sessions of a quiet machine); None without it."""
    reals = getattr(args, "reals", None)
    if reals is None:
        return None
    return reals / run_dir.parent.parent.name / run_dir.parent.name / f"{run_dir.name}.json"


#: How the learners' shards are dealt (the package's default; this benchmark passes no --shard-layout): part of every
#: saved run's key and of the tuning's context, so that runs made with contiguous shards (before
#: 0.4, without the key) are made again rather than mixed in.
LAYOUT = {"shard_layout": SHARD_LAYOUTS[0]}


def _real_key(flags: list[str], sc: Scenario, reruns: int) -> dict:
    """What a real run is made of beyond its flags: the failure trace's contents, the slowdown (an
    environment variable), the Slurm requeue schedule, and how many reruns a noisy run gets."""
    trace = hashlib.sha256(sc.trace.read_bytes()).hexdigest() if sc.trace is not None else None
    requeues = [list(r) for r in sc.requeues] if sc.slurm is not None else None
    return {"flags": flags, "trace": trace, "slowdown": sc.slowdown, "requeues": requeues, "reruns": reruns} | LAYOUT


def one_real_run(args: argparse.Namespace, sc: Scenario, flags: list[str], run_dir: Path, what: str) -> dict:
    """One `ddiloco run` of the scenario (on Slurm: preempted on its schedule); its summary."""
    if sc.slowdown:
        os.environ[STEP_SLOWDOWN_ENV] = ",".join(f"{f:g}" for f in sc.slowdown)
    try:
        if sc.slurm is not None:
            limit = args.cap_seconds + 300.0
            wait = sc.extra["down_s"]  # held in the queue for the scenario's requeue wait
            return preempted_run(flags, run_dir, what, sc.requeues, sc.slurm, console, limit, wait)
        return ddiloco_run(flags, run_dir, what)
    finally:
        os.environ.pop(STEP_SLOWDOWN_ENV, None)


def tuned_flags(tuned: dict[str, float]) -> list[str]:
    """`--inner-lr X` and, as given (the DiLoCo family), `--outer-lr`, `--outer-momentum`."""
    return [f for name, value in tuned.items() for f in ("--" + name.replace("_", "-"), repr(value))]


def _sim_key(flags: list[str]) -> dict:
    """What a virtual-clock run is made of: its flags, and the contents of the failure trace they name."""
    trace = Path(flags[flags.index("--chaos-trace") + 1]) if "--chaos-trace" in flags else None
    return {"flags": flags, "trace": hashlib.sha256(trace.read_bytes()).hexdigest() if trace else None} | LAYOUT


def saved_result(saved: Path, key: dict) -> dict | None:
    """The result the file SAVED holds, if it was made of what `key` says."""
    if not saved.is_file():
        return None
    data = json.loads(saved.read_text())
    return data["result"] if data.get("key") == json.loads(json.dumps(key)) else None


def save_result(saved: Path, key: dict, result: dict) -> dict:
    """`result` kept in the file SAVED with its key (atomically), and returned as it reads back."""
    result = json.loads(json.dumps(result, default=float))
    saved.parent.mkdir(parents=True, exist_ok=True)
    tmp = saved.with_suffix(".tmp")
    tmp.write_text(json.dumps({"key": key, "result": result}))
    os.replace(tmp, saved)
    return result


def saved_sim(flags: list[str], kept: Path) -> dict | None:
    """The run the file KEPT holds, if it was made of these flags and trace."""
    return saved_result(kept, _sim_key(flags))


def sim_kept(args: argparse.Namespace, run_dir: Path) -> Path:
    """Where the virtual-clock run RUN_DIR (BASE/seed-N/SCENARIO/sim-METHOD) keeps its result: in it, or
    with --sims DIR at DIR/seed-N/SCENARIO/sim-METHOD.json, a folder that can outlive the run directory."""
    if args.sims is None:
        return run_dir / "sim-result.json"
    return args.sims / run_dir.parent.parent.name / run_dir.parent.name / f"{run_dir.name}.json"


def cached_sim(flags: list[str], run_dir: Path, kept: Path | None = None) -> dict:
    """`sim_run`, read back from KEPT (default RUN_DIR/sim-result.json) when that holds a finished run
    with the same flags: the virtual clock's runs do not depend on the machine's load, so `--sims-only`
    can make them beside other work and the real runs, on a quiet machine, take them from there."""
    kept = kept or run_dir / "sim-result.json"
    found = saved_sim(flags, kept)
    if found is not None:
        return found
    if run_dir.exists():  # a run cut short, or made of other flags or another trace
        shutil.rmtree(run_dir)
    return save_result(kept, _sim_key(flags), sim_run(flags, run_dir))


def sims_only(args: argparse.Namespace, tuned: dict[str, dict[str, float]], base: Path, params: int) -> int:
    """Every scenario's virtual-clock runs, every seed (`--sims-only`); how many were made now."""
    made = 0
    wanted = args.preemptible_backend if "preemptible" in args.scenarios else "local"
    with slurm_or_local(wanted, console) as slurm:  # the preemptible trace follows the backend's schedule
        for seed in args.seeds:
            seed_args = argparse.Namespace(**{**vars(args), "seed": seed})
            seed_base = base / f"seed-{seed}"
            for sc in scenarios(seed_args, seed_base, params, slurm):
                for method in METHODS:
                    run_dir, flags = (
                        seed_base / sc.name / f"sim-{method}",
                        sim_flags(seed_args, sc, method, tuned[method]),
                    )
                    made += saved_sim(flags, sim_kept(args, run_dir)) is None
                    result = cached_sim(flags, run_dir, sim_kept(args, run_dir))
                    loss = result["summary"].get("eval_loss")
                    console.print(f"virtual clock: {sc.name} / {method} / seed {seed}: eval loss {loss}")
    return made


def sim_flags(args: argparse.Namespace, sc: Scenario, method: str, tuned: dict[str, float]) -> list[str]:
    flags = ["--method", method, "--learners", str(args.learners), "--model-size", args.model_size]
    flags += ["--data", str(args.data), "--seq-len", str(args.seq_len), "--batch-size", str(args.batch_size)]
    flags += ["--inner-optimizer", args.inner_optimizer]
    flags += ["--tokens", str(args.tokens), "--seed", str(args.seed), *tuned_flags(tuned)]
    flags += ["--step-time", str(args.min_step_seconds), "--eval-batches", str(args.eval_batches)]
    flags += ["--reconfigure-seconds", str(args.reconfigure_seconds)]
    if sc.link is not None:
        flags += ["--net-latency", str(sc.link[0]), "--net-bandwidth", str(sc.link[1])]
    else:  # one site: loopback
        flags += ["--net-latency", "0.5", "--net-bandwidth", "1000"]
    if sc.slowdown:
        flags += ["--speeds", ",".join(f"{f:g}" for f in sc.slowdown)]
    if sc.trace is not None:
        flags += ["--chaos-trace", str(sc.trace)]
    # one thread: a virtual-clock run shares the machine (tuning in two processes, `--sims-only` beside
    # other work), and torch's two threads beside a busy core wait on each other at every op: a
    # full-size run took 45 min so, against 7.5 min on one thread
    return [*flags, "--threads", "1"]


def tune(args: argparse.Namespace, base: Path) -> tuple[dict[str, dict[str, float]], dict]:
    """Every method's settings bracketed on the virtual clock, no failures, the scenarios' budget
    (benchmarks/tuning.py), saved to and resumed from BASE/tuning.json; elastic-ddp takes ddp's (the
    same optimisation). (settings per method, the `tuning` report)."""
    plain = Scenario("tuning")

    def objective(method: str, settings: dict[str, float]) -> float:
        run_dir = base / "tuning" / "-".join([method, *(f"{v:g}" for v in settings.values())])
        return sim_run(sim_flags(args, plain, method, settings), run_dir)["summary"]["eval_loss"]

    tuner = Tuner(objective, args.tuning or base / "tuning.json", tuning_context(args), say=console.print)
    # the inner lr's first grid is centred on the optimizer's default (train.inner.DEFAULT_LR)
    centred = dataclasses.replace(INNER_LR, default=DEFAULT_LR[args.inner_optimizer])
    family, data_parallel = (centred, *DILOCO_FAMILY[1:]), (centred, *DATA_PARALLEL[1:])
    first = [m for m in args.tune_first if m in ("ddp", *FAMILY)]
    order = [*first, *(m for m in ("ddp", *FAMILY) if m not in first)]
    report = {m: tuner.tune(m, family if m in FAMILY else data_parallel) for m in order}
    ddp = {k: v for k, v in report["ddp"].items() if k != "losses"}
    report = {"ddp": report["ddp"], "elastic-ddp": {**ddp, "takes": "ddp"}, **{m: report[m] for m in FAMILY}}
    for entry in report.values():
        entry["tuned"] = True
    console.print(f"tuning: {tuner.evaluated} new runs on the virtual clock, {len(tuner.memo)} in {tuner.path}")
    return {m: dict(report[m]["chosen"]) for m in METHODS}, report


def tuning_context(args: argparse.Namespace) -> dict:
    """What the tuning runs depend on besides the method and tuned settings: a tuning.json made with
    other values is refused."""
    keys = ("model_size", "data", "tokens", "learners", "seq_len", "batch_size", "seed", "inner_optimizer")
    keys += ("min_step_seconds", "eval_batches", "reconfigure_seconds")
    return {k: str(getattr(args, k)) if k == "data" else getattr(args, k) for k in keys} | LAYOUT


def untuned(args: argparse.Namespace) -> tuple[dict[str, dict[str, float]], dict]:
    """--no-sweep: every method at --inner-lr, the DiLoCo family at the default outer lr and momentum."""
    lr = args.inner_lr if args.inner_lr is not None else DEFAULT_LR[args.inner_optimizer]
    note = f"--no-sweep: not tuned; every method at --inner-lr {lr:g}, outer settings at their defaults"
    chosen = {m: {"inner_lr": lr} for m in METHODS}
    return chosen, {m: {"tuned": False, "chosen": chosen[m], "note": note} for m in METHODS}


def compare(runs: dict[str, dict], tolerance: float = 0.0) -> dict:
    """Target (the best baseline's final loss), seconds to it (to within `tolerance`, the evaluation's
    resolution: at equal tokens the methods end within hundredths of each other), losses at the first
    finish."""
    finals = {m: r["curve"][-1][1] for m, r in runs.items() if r["curve"]}
    baselines = [m for m in BASELINES if m in finals]
    best = min(baselines, key=lambda m: finals[m]) if baselines else None
    target = finals[best] if best is not None else math.nan
    first = min(r["finish"] for r in runs.values())
    out = {"target": target, "best_baseline": best, "first_finish_seconds": first, "seconds": {}, "at_first": {}}
    rivals = [m for m in SYNCHRONOUS if m in finals]  # the better synchronous DiLoCo, by final loss
    out["best_synchronous"] = min(rivals, key=lambda m: finals[m]) if rivals else None
    out["strict"] = {}
    for m, r in runs.items():
        out["seconds"][m] = seconds_to_target(r["curve"], target + tolerance)
        out["strict"][m] = seconds_to_target(r["curve"], target)
        out["at_first"][m] = loss_at(r["curve"], first)
    return out


def aim_met(name: str, seconds: dict, best: str | None) -> bool | None:
    d = seconds.get("decoupled")
    inf = float("inf")
    if name in ("cross_site", "mixed_hardware") and best is not None:
        b = seconds.get(best)
        return d is not None and d <= 0.5 * (b if b is not None else inf)
    if name in ("one_site", "preemptible"):
        e = seconds.get("elastic-ddp")
        return d is not None and d < (e if e is not None else inf)
    return None


def ratio(a: float | None, b: float | None) -> float | None:
    return a / b if a is not None and b not in (None, 0) else None


def one_scenario(args: argparse.Namespace, sc: Scenario, tuned: dict[str, dict[str, float]], base: Path) -> dict:
    real, sim = {}, {}
    for method in METHODS:
        real[method] = run_real(args, sc, method, tuned[method], base / sc.name / method)
    if not args.no_sim:
        for method in METHODS:
            run_dir = base / sc.name / f"sim-{method}"
            sim[method] = cached_sim(sim_flags(args, sc, method, tuned[method]), run_dir, sim_kept(args, run_dir))
    c, cs = compare(real, args.tolerance), compare(sim, args.tolerance) if sim else None
    rows = []
    for m in METHODS:
        s = real[m]["summary"]
        row = {
            "method": m,
            "seconds_to_target": c["seconds"][m],
            "seconds_to_target_strict": c["strict"][m],
            "loss_at_first_finish": c["at_first"][m],
            "goodput": s["goodput"],
            "eval_loss": s.get("eval_loss"),
            "finish_seconds": real[m]["finish"],
            "startup_seconds": real[m]["start"],
            "reached_budget": s["tokens_merged"] >= args.tokens * 0.999 or s["tokens"] >= args.tokens,
            "tokens_merged": s["tokens_merged"],
            "tokens_trained": s["tokens_trained"],
            "eval_batches": real[m]["eval_batches"],  # every evaluation's, curve and target alike
            "quiet": real[m]["quiet"],  # False: others used > runs.QUIET_SHARE of the CPU, even after reruns
            "others_cpu_share": real[m]["others_cpu_share"],
            "attempts": real[m]["attempts"],
            **tuned[m],  # inner_lr, and the DiLoCo family's outer_lr and outer_momentum when tuned
            "requeues": s.get("requeues"),  # on Slurm: preemptions done (a job not running is skipped)
        }
        if cs is not None:
            ss = sim[m]["summary"]
            row.update(
                sim_seconds_to_target=cs["seconds"][m],
                sim_goodput=ss["goodput"],
                sim_eval_loss=ss.get("eval_loss"),
                sim_over_real_seconds_to_target=ratio(cs["seconds"][m], c["seconds"][m]),
                sim_over_real_goodput=ratio(ss["goodput"], s["goodput"]),
            )
        rows.append(row)
    agreement = None
    if cs is not None:
        g = [r["sim_over_real_goodput"] for r in rows if r["sim_over_real_goodput"] is not None]
        t = [r["sim_over_real_seconds_to_target"] for r in rows if r["sim_over_real_seconds_to_target"] is not None]
        agreement = {
            "goodput_ratio_median": statistics.median(g) if g else None,
            "seconds_to_target_ratio_median": statistics.median(t) if t else None,
            "same_winner": _winner(c["seconds"]) == _winner(cs["seconds"]),
            "sim_target": cs["target"],
            "sim_best_baseline": cs["best_baseline"],
        }
    plot(sc.name, real, sim, c, base / f"time-to-loss-{sc.name}.png")
    return {
        "rows": rows,
        "target": c["target"],
        "tolerance": args.tolerance,
        "best_baseline": c["best_baseline"],
        "best_synchronous": c["best_synchronous"],
        "first_finish_seconds": c["first_finish_seconds"],
        "aim": sc.aim,
        "aim_met": aim_met(sc.name, c["seconds"], c["best_baseline"]),
        "note": sc.note,
        "scenario": {"link": sc.link, "slowdown": sc.slowdown, **sc.extra},
        "agreement": agreement,
        "curves": {m: real[m]["curve"] for m in METHODS},
        "sim_curves": {m: sim[m]["curve"] for m in sim},
    }


def _winner(seconds: dict) -> str | None:
    reached = {m: s for m, s in seconds.items() if s is not None}
    return min(reached, key=lambda m: reached[m]) if reached else None


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--scenarios", nargs="+", choices=SCENARIOS, default=list(SCENARIOS))
    p.add_argument("--learners", type=int, default=4)
    p.add_argument("--seq-len", type=int, default=64)
    p.add_argument("--batch-size", type=int, default=16)
    p.add_argument("--inner-optimizer", choices=INNER_OPTIMIZERS, default=InnerConfig().optimizer)
    p.add_argument("--inner-lr", type=float, default=None, help="with --no-sweep: every method's (DEFAULT_LR)")
    p.add_argument("--min-step-seconds", type=float, default=0.1)
    p.add_argument(
        "--seed",
        type=int,
        default=None,
        help="the tuning's seed (default: the first of --seeds, else 0), and the runs' without --seeds: a second "
        "process with --seeds 1 2 --seed 0 shares the first's tuning",
    )
    p.add_argument("--seeds", type=int, nargs="+", default=None, help="run every scenario once per seed")
    p.add_argument("--reruns", type=int, default=1, help="redo a run made beside other work this many times")
    p.add_argument("--cap", type=float, default=3.0, help="cap every run at this many times its ideal time")
    p.add_argument("--eval-every", type=float, default=4.0)
    p.add_argument("--eval-batches", type=int, default=8)
    p.add_argument("--reconfigure-seconds", type=float, default=1.0, help="virtual clock: elastic-ddp regroup")
    p.add_argument("--allreduce-precision", choices=("bf16", "fp32"), default="bf16", help="ddp's all-reduce")
    p.add_argument("--tolerance", type=float, default=0.01, help="a loss within this of the target reaches it")
    p.add_argument("--no-sim", action="store_true", help="real processes only")
    p.add_argument("--no-sweep", action="store_true", help="no tuning: every method at --inner-lr")
    p.add_argument("--tune-only", action="store_true", help="tune (resumable in --run-dir), print, and stop")
    p.add_argument(
        "--sims-only",
        action="store_true",
        help="tune, then make every scenario's and seed's virtual-clock runs (saved in --run-dir) and stop: they do "
        "not depend on the load, so this may run beside other work; the real runs later read them back",
    )
    p.add_argument(
        "--tune-first",
        nargs="+",
        default=[],
        choices=("ddp", *FAMILY),
        help="tune these methods before the others: a second process on the same --tuning file takes their runs "
        "while the first works through the others (the file merges both; one run each on 2 cores)",
    )
    p.add_argument("--run-dir", type=Path, default=None)
    p.add_argument(
        "--tuning",
        type=Path,
        default=None,
        help="the tuning runs' file (default RUN_DIR/tuning.json): one kept in benchmarks/results survives a lost "
        "run directory, and a rerun resumes from it",
    )
    p.add_argument(
        "--sims",
        type=Path,
        default=None,
        help="keep each virtual-clock run's result in this folder (default: in its run directory): one in "
        "benchmarks/results outlives the run directory; a run is read back with the same --run-dir and flags",
    )
    p.add_argument(
        "--reals",
        type=Path,
        default=None,
        help="keep each real run's result in this folder too (and read it back from there): one in "
        "benchmarks/results outlives the run directory, as --sims does for the virtual-clock runs",
    )
    p.add_argument("--preemptible-backend", choices=("local", "slurm"), default=None, help="default: slurm if it can")
    args = parse_run_arguments(p, tokens=3_000_000)
    args.seeds, args.seed = seeds(args.seeds, args.seed)
    args.failure_speedup = 1.0
    if args.quick:
        args.model_size, args.failure_speedup, args.eval_every = "tiny", 6.0, 2.0
        args.tokens = args.tokens if "--tokens" in sys.argv else 400_000
    steps = args.tokens / (args.learners * args.batch_size * args.seq_len)
    args.cap_seconds = args.cap * steps * args.min_step_seconds + 15.0  # + process start-up
    base = args.run_dir or ROOT / "runs" / time.strftime("time-to-loss-%Y%m%d-%H%M%S")
    base.mkdir(parents=True, exist_ok=True)
    from ddiloco.train.tasks import count_parameters, make_task

    task = make_task("gpt", str(args.data), seq_len=args.seq_len, model_size=args.model_size)
    params = count_parameters(task.build_model(args.seed))
    tuned, tuning = untuned(args) if args.no_sweep else tune(args, base)
    if args.tune_only:
        report(args, {}, params, tuned, tuning)
        return
    if args.sims_only:
        made = sims_only(args, tuned, base, params)
        console.print(f"virtual clock: {made} runs made now; the real runs read them from {args.sims or base}")
        return
    results = {}
    wanted = args.preemptible_backend if "preemptible" in args.scenarios else "local"
    per_seed: dict[str, dict[int, dict]] = {name: {} for name in args.scenarios}
    with slurm_or_local(wanted, console) as slurm:
        for seed in args.seeds:
            seed_args = argparse.Namespace(**{**vars(args), "seed": seed})
            seed_base = base / f"seed-{seed}"
            for sc in scenarios(seed_args, seed_base, params, slurm):
                per_seed[sc.name][seed] = scenario_once(seed_args, sc, tuned, seed_base)
                show(f"{sc.name}, seed {seed}", per_seed[sc.name][seed])
    for name, runs in per_seed.items():
        results[name] = {**across_seeds(runs, METHODS, BASELINES, partial(aim_met, name)), "aim": AIMS.get(name, "")}
        results[name]["per_seed"] = {str(s): r for s, r in sorted(runs.items())}
        show_seeds(name, results[name], results[name]["aim"])
    (base / "time_to_loss.json").write_text(json.dumps({"scenarios": results}, default=float))
    console.print(f"run directory and plots: {base}")
    report(args, results, params, tuned, tuning)


def seeds(runs: list[int] | None, tuning: int | None) -> tuple[list[int], int]:
    """(the seeds every scenario runs with, the tuning's seed): --seeds, else --seed, else 0; the
    tuning's is --seed where given, else the first of the runs' (so `--seeds 1 2 --seed 0` tunes, or
    reads the tuning, at seed 0 and runs seeds 1 and 2)."""
    runs = runs or [tuning if tuning is not None else 0]
    return runs, tuning if tuning is not None else runs[0]


def scenario_once(args: argparse.Namespace, sc: Scenario, tuned: dict[str, dict[str, float]], base: Path) -> dict:
    """One seed of one scenario, saved to BASE/SCENARIO.json as it ends; a rerun with the same
    --run-dir and the same settings takes it from there (full-size seeds take hours)."""
    path = base / f"{sc.name}.json"
    keys = ("cap", "eval_every", "tolerance", "no_sim", "failure_speedup", "preemptible_backend")
    key = {"settings": {**tuning_context(args), **{k: getattr(args, k) for k in keys}}, "tuned": tuned}
    saved = saved_result(path, key)
    if saved is not None:
        console.print(f"{sc.name}, seed {args.seed}: done before, read from {path}")
        return saved
    return save_result(path, key, one_scenario(args, sc, tuned, base))  # atomically, as every run's


def report(args: argparse.Namespace, results: dict, params: int, tuned: dict, tuning: dict) -> None:
    """With --json, the last line: the scenarios' figures, the settings and every method's tuning."""
    if args.json:
        settings = {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()}
        inner = {m: tuned[m]["inner_lr"] for m in tuned}
        out = {"scenarios": results, "settings": settings, "params": params, "inner_lr": inner, "tuned": tuned}
        print(json.dumps({**out, "tuning": tuning}, sort_keys=True, default=float))


if __name__ == "__main__":
    sys.exit(main())
