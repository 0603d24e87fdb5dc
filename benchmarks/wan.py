"""Training across distant data centres, emulated: real `ddiloco run`s whose learners talk to the
synchronizer through an emulated wide-area link (latency, jitter and a bandwidth cap each way,
`--net-latency/--net-jitter/--net-bandwidth`; latency is propagation, every reply pays the way back,
and each bulk-socket push opens a connection: `learner.wan`), Decoupled DiLoCo against synchronous
DiLoCo on the same links and budget, and both against the same runs on plain loopback, side by side,
over several seeds (mean and spread).

Goodput is the share of the learners' allocated time whose work reached the global model; eval loss
is the final global model's on held-out text; merged share is tokens merged / tokens trained; tau is
the overlap each Decoupled learner chose for its link (`--overlap auto`, the default).

Every step is padded to --min-step-seconds (0.1 s), so that each learner behaves like its own
accelerator instead of sharing this machine's two cores (as in benchmarks/chaos.py).

    python benchmarks/wan.py                  # 100 ms +- 20 ms, 50 MB/s, the default GPT, 3 seeds (~15 minutes)
    python benchmarks/wan.py --quick --json   # the same link, the tiny GPT, half the tokens (~5 minutes)
    python benchmarks/wan.py --table --quick  # latency 5/50/100/250 ms at 50 MB/s, 5/50/500 MB/s at 50 ms
    python benchmarks/wan.py --quick --network hosts --json   # the same rows over real kernel TCP (root)

With `--network hosts` (root; docs/hosts.md) every run is `ddiloco run --network hosts`: each process on
a host of its own, the learners' links shaped by the kernel and the TUN delay relay (`--link
latency=L,jitter=J,rate=8B mbit` for L ms, J ms, B MB/s) instead of emulated in the learner; the
"loopback" rows are the same hosts with unshaped links. Each row also records what learner 0's link
measured before the run (round trip, throughput each way).
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
from pathlib import Path

from rich.console import Console
from rich.table import Table
from runs import ddiloco_run, parse_run_arguments

from ddiloco.train.inner import INNER_OPTIMIZERS, InnerConfig

console = Console(stderr=True, width=150)
METHODS = ("decoupled", "diloco")
TABLE_LINKS = [(5, 50), (50, 50), (100, 50), (250, 50), (50, 5), (50, 500)]  # (one-way ms, MB/s)


def link_flags(latency: float, jitter: float, bandwidth: float, network: str = "emulated") -> list[str]:
    if network == "hosts":  # the same link, made by the kernel between hosts (MB/s -> Mbit/s)
        return ["--network", "hosts", "--link", f"latency={latency:g}ms,jitter={jitter:g}ms,rate={bandwidth * 8:g}mbit"]
    return ["--net-latency", str(latency), "--net-jitter", str(jitter), "--net-bandwidth", str(bandwidth)]


def one_run(args: argparse.Namespace, method: str, link: list[str], seed: int, tmp: Path, name: str) -> dict:
    flags = ["--method", method, "--learners", str(args.learners), "--model-size", args.model_size]
    flags += ["--data", str(args.data), "--tokens", str(args.tokens), "--seed", str(seed)]
    flags += ["--min-step-seconds", str(args.min_step_seconds), *link]
    flags += ["--inner-optimizer", getattr(args, "inner_optimizer", InnerConfig().optimizer)]
    if getattr(args, "network", "emulated") == "hosts" and "--network" not in link:
        flags += ["--network", "hosts"]  # the unshaped row: hosts all the same
    console.print(f"[bold]{method} on {name}, seed {seed}[/bold]: ddiloco run {' '.join(flags)}")
    r = ddiloco_run(flags, tmp / f"{method}-{name}-{seed}", f"{method} on {name}")
    taus = [c["tau"] for c in r.get("overlap_chosen", {}).values()]
    return {
        "method": method,
        "link": name,
        "seed": seed,
        "goodput": r["goodput"],
        "eval_loss": r.get("eval_loss"),
        "run_seconds": r["run_seconds"],
        "outer_steps": r["outer_steps"],
        "tokens_merged": r["tokens_merged"],
        "tokens_trained": r["tokens_trained"],
        "merged_share": r["tokens_merged"] / max(1, r["tokens_trained"]),
        "tokens_by_cause": r.get("tokens_by_cause"),
        "tau": max(taus) if taus else None,
        "network": getattr(args, "network", "emulated"),
        "link_measured": r.get("network", {}).get("hosts", {}).get("learner0"),  # --network hosts only
    }


def spread(values: list[float]) -> dict:
    """Mean, sample standard deviation, min and max of one figure over the seeds."""
    return {
        "mean": statistics.fmean(values),
        "std": statistics.stdev(values) if len(values) > 1 else 0.0,
        "min": min(values),
        "max": max(values),
    }


def summarise(rows: list[dict]) -> dict:
    """Per (method, link): each figure's spread over the seeds."""
    out: dict = {}
    for key in sorted({(r["method"], r["link"]) for r in rows}):
        group = [r for r in rows if (r["method"], r["link"]) == key]
        losses = [r["eval_loss"] for r in group if isinstance(r["eval_loss"], float)]
        taus = [r["tau"] for r in group if r["tau"] is not None]
        out[f"{key[0]}/{key[1]}"] = {
            "goodput": spread([r["goodput"] for r in group]),
            "eval_loss": spread(losses) if losses else None,
            "merged_share": spread([r["merged_share"] for r in group]),
            "tau": spread([float(t) for t in taus]) if taus else None,
            "seeds": len(group),
        }
    return out


def show(summary: dict, title: str) -> None:
    table = Table(title=title)
    for col in ("method / link", "goodput", "eval loss", "merged / trained", "tau", "seeds"):
        table.add_column(col, justify="right")

    def cell(s: dict | None, digits: int) -> str:
        return "-" if s is None else f"{s['mean']:.{digits}f} ± {s['std']:.{digits}f}"

    for key, s in summary.items():
        table.add_row(
            key,
            cell(s["goodput"], 3),
            cell(s["eval_loss"], 4),
            cell(s["merged_share"], 3),
            cell(s["tau"], 1),
            str(s["seeds"]),
        )
    console.print(table)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--latency", type=float, default=100.0, help="milliseconds, one way")
    p.add_argument("--jitter", type=float, default=20.0, help="milliseconds")
    p.add_argument("--bandwidth", type=float, default=50.0, help="MB/s each way")
    p.add_argument("--learners", type=int, default=4)
    p.add_argument("--seeds", type=int, default=3, help="seeds per configuration (mean and spread)")
    p.add_argument("--table", action="store_true", help="the link table: latencies at 50 MB/s, bandwidths at 50 ms")
    p.add_argument("--methods", nargs="+", choices=METHODS, default=list(METHODS), help="the methods to run")
    p.add_argument(
        "--min-step-seconds",
        type=float,
        default=0.1,
        help="pad every step to this long, so each learner behaves like its own accelerator",
    )
    p.add_argument(
        "--network",
        choices=("emulated", "hosts"),
        default="emulated",
        help="emulated: the link in the learner (--net-*); hosts: real kernel TCP across hosts (root, docs/hosts.md)",
    )
    p.add_argument(
        "--inner-optimizer",
        choices=INNER_OPTIMIZERS,
        default=InnerConfig().optimizer,
        help="the learners' inner optimizer, at its own default lr (results files before 0.4 used adamw)",
    )
    args = parse_run_arguments(p, tokens=3_000_000)
    if args.quick:
        args.model_size, args.tokens = "tiny", 1_500_000
    seeds = range(args.seeds)
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        if args.table:
            for latency, bandwidth in TABLE_LINKS:
                name = f"{latency:g}ms-{bandwidth:g}MBps"
                for method in args.methods:
                    for seed in seeds:
                        flags = link_flags(latency, latency / 5, bandwidth, args.network)  # jitter: latency / 5
                        rows.append(one_run(args, method, flags, seed, Path(tmp), name))
        else:
            for method in args.methods:
                wan = link_flags(args.latency, args.jitter, args.bandwidth, args.network)
                for name, link in (("loopback", []), ("wan", wan)):
                    for seed in seeds:
                        rows.append(one_run(args, method, link, seed, Path(tmp), name))
    summary = summarise(rows)
    size = f"{args.learners} learners, {args.model_size} GPT, {args.tokens} tokens, {args.seeds} seeds"
    size += ", on hosts (real TCP)" if args.network == "hosts" else ""
    if args.table:
        show(summary, f"{size}; jitter a fifth of the latency")
        print(json.dumps({"rows": rows, "summary": summary}, sort_keys=True) if args.json else "")
        return
    show(summary, f"{size}; link: {args.latency:g} ms +- {args.jitter:g} ms, {args.bandwidth:g} MB/s each way")

    if set(args.methods) != set(METHODS):  # the ratios need both methods
        print(json.dumps({"rows": rows, "summary": summary}, sort_keys=True) if args.json else "")
        return

    def mean(key: str, figure: str) -> float:
        return summary[key][figure]["mean"]

    figures = {
        "decoupled_over_diloco_goodput_wan": mean("decoupled/wan", "goodput") / mean("diloco/wan", "goodput"),
        "decoupled_wan_over_loopback_goodput": mean("decoupled/wan", "goodput") / mean("decoupled/loopback", "goodput"),
        "decoupled_merged_share_wan": mean("decoupled/wan", "merged_share"),
        "eval_loss_wan": {m: summary[f"{m}/wan"]["eval_loss"] for m in METHODS},
    }
    console.print(
        f"on the {'kernel-shaped link between hosts' if args.network == 'hosts' else 'emulated link'}, "
        f"Decoupled DiLoCo's goodput is {figures['decoupled_over_diloco_goodput_wan']:.2f}x "
        f"synchronous DiLoCo's and {figures['decoupled_wan_over_loopback_goodput']:.2f}x its own on loopback; "
        f"it merged {figures['decoupled_merged_share_wan']:.3f} of the tokens it trained"
    )
    if args.json:
        print(
            json.dumps(
                {
                    "rows": rows,
                    "summary": summary,
                    **figures,
                    "network": args.network,
                    "inner_optimizer": args.inner_optimizer,
                },
                sort_keys=True,
            )
        )


if __name__ == "__main__":
    main()
