"""What benchmarks/time_to_loss.py shows of a scenario: its table on the console and its plot of eval
loss against wall time (real processes and the virtual clock side by side)."""

from __future__ import annotations

import json
from pathlib import Path

from rich.console import Console
from rich.table import Table

console = Console(stderr=True, width=160)


def plot(name: str, real: dict, sim: dict, c: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2 if sim else 1, figsize=(12 if sim else 6.5, 4.2), squeeze=False)
    for ax, runs, title in ((axes[0][0], real, "real processes (wall clock)"), (axes[0][-1], sim, "virtual clock")):
        if not runs or (ax is axes[0][-1] and runs is sim and not sim):
            continue
        for m, r in runs.items():
            if r["curve"]:
                ax.plot(*zip(*r["curve"], strict=True), label=m, marker=".")
        ax.set(title=f"{name}: {title}", xlabel="seconds", ylabel="eval loss")
        ax.grid(alpha=0.3)
        ax.legend()
    axes[0][0].axhline(c["target"], color="grey", ls="--", lw=0.8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def show(name: str, result: dict) -> None:
    t = Table(
        title=f"{name}: target {result['target']:.4f} (final loss of {result['best_baseline']}, "
        f"+ {result['tolerance']:g}); "
        f"first finish at {result['first_finish_seconds']:.1f} s"
    )
    cols = ("method", "s to target", "loss at first finish", "goodput", "eval loss", "finish s", "sim s to target")
    requeued = any(r.get("requeues") is not None for r in result["rows"])  # on Slurm: preemptions done
    for col in (*cols, "requeues") if requeued else cols:
        t.add_column(col, justify="right")

    def f(v: float | None, fmt: str) -> str:
        return "never" if v is None else fmt.format(v)

    for r in result["rows"]:
        t.add_row(
            r["method"],
            f(r["seconds_to_target"], "{:.1f}"),
            f(r["loss_at_first_finish"], "{:.4f}"),
            f"{r['goodput']:.3f}",
            f(r["eval_loss"], "{:.4f}"),
            f"{r['finish_seconds']:.1f}" + ("" if r["reached_budget"] else " (cap)"),
            f(r.get("sim_seconds_to_target"), "{:.1f}") if "sim_seconds_to_target" in r else "-",
            *([str(r.get("requeues"))] if requeued else []),
        )
    console.print(t)
    met = {True: "met", False: "NOT met", None: "-"}[result["aim_met"]]
    console.print(f"aim ({result['aim']}): {met}" + (f"; note: {result['note']}" if result["note"] else ""))
    if result["agreement"]:
        a = result["agreement"]
        console.print(f"virtual clock vs real: {json.dumps({k: a[k] for k in a}, default=str)}")
