"""Goodput against chip count, one line per method (and learner count), with 95 % intervals."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from .runner import Summary


def label(row: Summary) -> str:
    return row.method if row.method in ("ddp", "elastic-ddp") else f"{row.method} M={row.learners}"


def chip_label(n: int) -> str:
    """150000 -> 150k, 1200000 -> 1.2M."""
    if n >= 1_000_000:
        return f"{n / 1e6:g}M"
    return f"{n / 1e3:g}k" if n >= 1000 else str(n)


def plot_goodput(rows: Sequence[Summary], path: str | Path, title: str = "") -> None:
    """Write a PNG (matplotlib, Agg backend: works without a display)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    lines: dict[str, list[Summary]] = {}
    for r in rows:
        lines.setdefault(label(r), []).append(r)
    fig, ax = plt.subplots(figsize=(8, 5))
    for name, rs in lines.items():
        rs = sorted(rs, key=lambda r: r.chips)
        style = "--" if rs[0].method == "diloco" else "-"
        ax.errorbar(
            [r.chips for r in rs],
            [100 * r.goodput for r in rs],
            yerr=[100 * r.goodput_ci for r in rs],
            fmt=style,
            marker="o",
            ms=4,
            capsize=3,
            label=name,
        )
    ax.set_xscale("log")
    ticks = sorted({r.chips for r in rows})
    ax.set_xticks(ticks, [chip_label(n) for n in ticks])
    ax.minorticks_off()
    ax.set_xlabel("chips")
    ax.set_ylabel("goodput (%)")
    ax.set_ylim(0, 100)
    ax.grid(True, which="both", alpha=0.3)
    ax.set_title(title or "Goodput under failures")
    ax.legend(fontsize=8, ncol=2)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
