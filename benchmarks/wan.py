"""Training across distant data centres, emulated: real `ddiloco run`s whose learners talk to the
synchronizer through an emulated wide-area link (latency, jitter and a bandwidth cap each way,
`--net-latency/--net-jitter/--net-bandwidth`), Decoupled DiLoCo against synchronous DiLoCo on the
same links and budget, and both against the same runs on plain loopback, side by side.

Goodput is the share of the learners' allocated time whose work reached the global model; eval loss
is the final global model's on held-out text.

Every step is padded to --min-step-seconds (0.1 s), so that each learner behaves like its own
accelerator instead of sharing this machine's two cores (as in benchmarks/chaos.py).

    python benchmarks/wan.py                  # 100 ms +- 20 ms, 50 MB/s, the default GPT (~5 minutes)
    python benchmarks/wan.py --quick --json   # the same link, the tiny GPT, half the tokens (~3 minutes)
"""

from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path

from rich.console import Console
from rich.table import Table
from runs import ddiloco_run, parse_run_arguments

console = Console(stderr=True, width=150)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--latency", type=float, default=100.0, help="milliseconds, one way")
    p.add_argument("--jitter", type=float, default=20.0, help="milliseconds")
    p.add_argument("--bandwidth", type=float, default=50.0, help="MB/s each way")
    p.add_argument("--learners", type=int, default=4)
    p.add_argument(
        "--min-step-seconds",
        type=float,
        default=0.1,
        help="pad every step to this long, so each learner behaves like its own accelerator",
    )
    args = parse_run_arguments(p, tokens=3_000_000)
    if args.quick:
        args.model_size, args.tokens = "tiny", 1_500_000
    link = [
        "--net-latency",
        str(args.latency),
        "--net-jitter",
        str(args.jitter),
        "--net-bandwidth",
        str(args.bandwidth),
    ]
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for method in ("decoupled", "diloco"):
            for name, extra in (("loopback", []), ("wan", link)):
                flags = [
                    "--method",
                    method,
                    "--learners",
                    str(args.learners),
                    "--model-size",
                    args.model_size,
                    "--data",
                    str(args.data),
                    "--tokens",
                    str(args.tokens),
                    "--seed",
                    "0",
                    "--min-step-seconds",
                    str(args.min_step_seconds),
                    *extra,
                ]
                console.print(f"[bold]{method} on {name}[/bold]: ddiloco run {' '.join(flags)}")
                r = ddiloco_run(flags, Path(tmp) / f"{method}-{name}", f"{method} on {name}")
                rows.append(
                    {
                        "method": method,
                        "link": name,
                        "goodput": r["goodput"],
                        "eval_loss": r.get("eval_loss"),
                        "run_seconds": r["run_seconds"],
                        "outer_steps": r["outer_steps"],
                        "tokens_merged": r["tokens_merged"],
                        "tokens_trained": r["tokens_trained"],
                    }
                )
    by = {(r["method"], r["link"]): r for r in rows}
    for method in ("decoupled", "diloco"):
        by[(method, "wan")]["goodput_vs_loopback"] = (
            by[(method, "wan")]["goodput"] / by[(method, "loopback")]["goodput"]
        )
    table = Table(
        title=f"{args.learners} learners, {args.model_size} GPT, {args.tokens} tokens; link: {args.latency:g} ms "
        f"+- {args.jitter:g} ms, {args.bandwidth:g} MB/s each way"
    )
    for col in ("method", "link", "goodput", "eval loss", "seconds", "outer steps", "tokens merged / trained"):
        table.add_column(col, justify="right")
    for r in rows:
        loss = f"{r['eval_loss']:.4f}" if isinstance(r["eval_loss"], float) else "-"
        table.add_row(
            r["method"],
            r["link"],
            f"{r['goodput']:.3f}",
            loss,
            f"{r['run_seconds']:.0f}",
            str(r["outer_steps"]),
            f"{r['tokens_merged'] / max(1, r['tokens_trained']):.3f}",
        )
    console.print(table)
    ratio = by[("decoupled", "wan")]["goodput"] / by[("diloco", "wan")]["goodput"]
    console.print(f"on the emulated link, Decoupled DiLoCo's goodput is {ratio:.2f}x synchronous DiLoCo's")
    if args.json:
        print(json.dumps({"rows": rows, "decoupled_over_diloco_goodput_wan": ratio}, sort_keys=True))


if __name__ == "__main__":
    main()
