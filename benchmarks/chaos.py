"""Chaos: `ddiloco run` with real processes and kill -9, Decoupled DiLoCo against the synchronous
baseline (classic DiLoCo: one fragment, blocking syncs, K = M) under the very same fault schedule,
side by side in one run.

Each learner is killed with kill -9 at exponential intervals (mean --mtbf seconds) and restarted
--down seconds later; the schedule is drawn once from the seed and replayed to both methods with
--chaos-trace, so both face the same outages at the same offsets from their launch. Both train the
same token budget, so eval loss is compared at equal tokens. Reported per method: goodput, the
learners' availability (share of learner-time not inside an outage), goodput / availability,
stall_seconds_max against 2 x H step times, eval loss, wall time.

    python benchmarks/chaos.py                # 4 learners, mtbf 60 s, down 15 s: ~7 minutes
    python benchmarks/chaos.py --quick --json # short faults, small budget: ~2 minutes
    python benchmarks/chaos.py --model-size default --min-step-seconds 0 --tokens 5000000
                                              # real compute only (learners share the CPU)
    python benchmarks/chaos.py --quick --network hosts --link "latency=50ms,rate=400mbit" --json
                                              # the same over real kernel TCP, each process on its host (root)
    python benchmarks/chaos.py --backend slurm --quick --json
                                              # real Slurm: learner jobs requeued (benchmarks/chaos_slurm.py)

By default every learner step is padded to 0.1 s (--min-step-seconds): on a machine with fewer cores
than learners, the learners otherwise share the CPU, a dead learner's CPU goes to the survivors, and
neither the cost of a failure nor the cost of waiting shows. The padding makes each learner behave as
if it had its own accelerator, as in the setting the paper describes (and the simulator models).
"""

from __future__ import annotations

import argparse
import json
import signal
import sys
import tempfile
from pathlib import Path

from rich.console import Console
from rich.table import Table
from runs import DEFAULT_DATA, ddiloco_run

from ddiloco.chaos.injector import ChaosSettings, learner_trace
from ddiloco.learner.journal import read_journals

console = Console(stderr=True)


def run_method(method: str, args: argparse.Namespace, trace: Path, run_dir: Path) -> dict:
    cmd = [
        "--method",
        method,
        "--learners",
        str(args.learners),
        "--model-size",
        args.model_size,
        "--seq-len",
        str(args.seq_len),
        "--batch-size",
        str(args.batch_size),
        "--data",
        str(args.data),
        "--sync-every",
        str(args.sync_every),
        "--fragments",
        str(args.fragments),
        "--grace",
        str(args.grace),
        "--tokens",
        str(args.tokens),
        "--seed",
        str(args.seed),
        "--chaos-trace",
        str(trace),
        "--min-step-seconds",
        str(args.min_step_seconds),
    ]
    if getattr(args, "network", "loopback") == "hosts":  # each process on its own host, real kernel TCP
        cmd += ["--network", "hosts", *(a for spec in args.link or [] for a in ("--link", spec))]
    console.print(f"[bold]{method}[/bold]: ddiloco run {' '.join(cmd)}")
    result = ddiloco_run(cmd, run_dir, f"--method {method}")
    journals = list(read_journals(run_dir, "learner-*/journal-*.json"))
    steps = sum(j.get("steps", 0) for j in journals)
    result["step_seconds"] = sum(j.get("seconds", 0.0) for j in journals) / max(1, steps)
    result["goodput_over_availability"] = result["goodput"] / result["availability"]
    result["stall_limit_seconds"] = 2 * args.sync_every * result["step_seconds"]
    return result


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--learners", type=int, default=4)
    p.add_argument("--mtbf", type=float, default=60.0, help="mean seconds between kill -9 of each learner")
    p.add_argument("--down", type=float, default=15.0, help="seconds a killed learner stays down")
    p.add_argument("--tokens", type=int, default=6_000_000)
    p.add_argument("--model-size", default="tiny")
    p.add_argument("--seq-len", type=int, default=64)
    p.add_argument("--batch-size", type=int, default=16)
    p.add_argument("--sync-every", type=int, default=24)
    p.add_argument("--fragments", type=int, default=24)
    p.add_argument(
        "--grace",
        type=float,
        default=0.9,
        help="grace factor gamma; 0.9 lets learners out of phase by up to a step into the merge",
    )
    p.add_argument(
        "--min-step-seconds",
        type=float,
        default=0.1,
        help="pad every step to this long: learners behave as if each had its own accelerator "
        "(0: real compute only; then 4 learners share this machine's cores and a dead "
        "learner's CPU goes to the others, which hides what a failure costs)",
    )
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--data", type=Path, default=DEFAULT_DATA)
    p.add_argument("--run-dir", type=Path, default=None, help="keep both runs' folders here")
    p.add_argument("--quick", action="store_true")
    p.add_argument("--json", action="store_true")
    p.add_argument(
        "--backend",
        choices=["local", "slurm"],
        default="local",
        help="slurm: Slurm jobs, learner jobs requeued at --mtbf (Slurm brings them back)",
    )
    p.add_argument("--timeout", type=float, default=3600.0, help="slurm: give up on a run after this long")
    p.add_argument("--eval-batches", type=int, default=20)
    p.add_argument(
        "--network",
        choices=["loopback", "hosts"],
        default="loopback",
        help="hosts (root): every process on a host of its own, kills and outages over real TCP (docs/hosts.md)",
    )
    p.add_argument("--link", action="append", help='with --network hosts: a link, e.g. "latency=50ms,rate=400mbit"')
    args = p.parse_args()
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))
    if args.quick:
        args.tokens, args.mtbf, args.down = 1_500_000, 15.0, 4.0
    if args.backend == "slurm":
        if args.network == "hosts":
            raise SystemExit("--network hosts: with --backend local only")
        return slurm_main(args)
    with tempfile.TemporaryDirectory() as tmp_name:
        base = args.run_dir or Path(tmp_name)
        base.mkdir(parents=True, exist_ok=True)
        trace = learner_trace(
            ChaosSettings(learner_mtbf=args.mtbf, learner_down=args.down, seed=args.seed),
            args.learners,
            horizon=4 * 3600.0,
        )
        trace_path = base / "chaos-trace.csv"
        trace.save(trace_path)
        results = {m: run_method(m, args, trace_path, base / m) for m in ("decoupled", "diloco")}
    d, s = results["decoupled"], results["diloco"]
    table = Table(
        title=f"{args.learners} learners, kill -9 every {args.mtbf:g} s on average, down {args.down:g} s, "
        f"{args.tokens:,} tokens"
    )
    for col in ("", "decoupled", "diloco (sync)"):
        table.add_column(col, justify="right")
    rows = [
        ("goodput", "goodput", "{:.3f}"),
        ("availability", "availability", "{:.3f}"),
        ("goodput / availability", "goodput_over_availability", "{:.3f}"),
        ("stall_seconds_max", "stall_seconds_max", "{:.1f}"),
        ("2 x H step times (s)", "stall_limit_seconds", "{:.1f}"),
        ("eval loss", "eval_loss", "{:.4f}"),
        ("tokens trained", "tokens_trained", "{:,}"),
        ("tokens merged", "tokens_merged", "{:,.0f}"),
        ("learner restarts", "learner_restarts", "{}"),
        ("rejected contributions", "rejected_contributions", "{}"),
        ("wall seconds", "wall_seconds", "{:.0f}"),
        ("step seconds", "step_seconds", "{:.3f}"),
    ]
    for label, key, fmt in rows:
        table.add_row(label, fmt.format(d[key]), fmt.format(s[key]))
    console.print(table)
    summary = {
        "decoupled": d,
        "diloco": s,
        "ratio": d["goodput_over_availability"],
        "goodput_ratio_vs_sync": d["goodput"] / max(1e-9, s["goodput"]),
        "stall_within_limit": d["stall_seconds_max"] <= d["stall_limit_seconds"],
        "eval_loss_delta": d["eval_loss"] - s["eval_loss"],
    }
    console.print(
        f"decoupled goodput / availability: [bold]{summary['ratio']:.3f}[/bold] (aim: >= 0.85); "
        f"goodput decoupled / sync: {summary['goodput_ratio_vs_sync']:.2f}; decoupled stall "
        f"{d['stall_seconds_max']:.1f} s vs limit {d['stall_limit_seconds']:.1f} s"
    )
    if args.json:
        print(json.dumps(summary, sort_keys=True))


def slurm_main(args: argparse.Namespace) -> None:
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    import chaos_slurm

    summary = chaos_slurm.main(args, console)
    table = Table(
        title=f"Slurm: {args.learners} learner jobs, each requeued every {args.mtbf:g} s on average, "
        f"{args.tokens:,} tokens"
    )
    names = list(chaos_slurm.CONFIGS)
    table.add_column("")
    for name in names:
        table.add_column(name, justify="right")
    rows = [
        ("goodput", "goodput", "{:.3f}"),
        ("uptime", "uptime", "{:.3f}"),
        ("goodput / uptime", "goodput_over_uptime", "{:.3f}"),
        ("stall_seconds_max", "stall_seconds_max", "{:.1f}"),
        ("eval loss", "eval_loss", "{:.4f}"),
        ("tokens trained", "tokens_trained", "{:,}"),
        ("tokens merged", "tokens_merged", "{:,.0f}"),
        ("requeues", "requeues", "{}"),
        ("run seconds", "run_seconds", "{:.0f}"),
    ]
    for label, key, fmt in rows:
        table.add_row(label, *(fmt.format(summary[n][key]) for n in names))
    console.print(table)
    console.print(
        f"decoupled goodput / uptime [bold]{summary['ratio']:.3f}[/bold]; goodput decoupled / sync "
        f"{summary['goodput_ratio_vs_sync']:.2f}; eval loss cold - peer recovery "
        f"{summary['eval_loss_cost_of_cold_restarts']:+.4f}"
    )
    if args.json:
        print(json.dumps({k: v for k, v in summary.items()}, sort_keys=True, default=float))


if __name__ == "__main__":
    main()
