"""The report's figures, one function each; several runs share the loss and goodput axes."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from ..records.rundir import RunRecord
from .timeline import learner_intervals, merges, run_end


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")  # no display needed
    import matplotlib.pyplot as plt

    return plt


def _series(record: RunRecord, kind: str, key: str, x: str) -> tuple[list[float], list[float]]:
    points = [(m[x], m[key]) for m in record.metrics if m.get("kind") == kind and key in m]
    return [p[0] for p in points], [p[1] for p in points]


def loss_curves(records: Sequence[RunRecord], x: str, path: Path) -> Path:
    """Eval loss of the global model (solid) and training loss (dotted) against tokens or time."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(7, 4))
    for i, r in enumerate(records):
        color = f"C{i}"
        xs, ys = _series(r, "eval", "eval_loss", x)
        if xs:
            ax.plot(xs, ys, "-o", color=color, markersize=3, label=f"{r.label} eval")
        xs, ys = _series(r, "train", "train_loss", x)
        if xs:
            ax.plot(xs, ys, ":", color=color, alpha=0.7, label=f"{r.label} train")
    ax.set_xlabel("tokens trained" if x == "tokens" else "seconds since start")
    ax.set_ylabel("loss (nats per token)")
    ax.set_title(f"Loss against {'tokens' if x == 'tokens' else 'time'}")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    return _save(fig, path)


def goodput_curves(records: Sequence[RunRecord], path: Path) -> Path:
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(7, 3.5))
    for i, r in enumerate(records):
        for key, style in (("goodput", "-"), ("uptime", "--")):
            xs, ys = _series(r, "progress", key, "t")
            if xs:
                ax.plot(xs, ys, style, color=f"C{i}", label=f"{r.label} {key}")
    ax.set_ylim(0, 1.05)
    ax.set_xlabel("seconds since start")
    ax.set_ylabel("fraction")
    ax.set_title("Goodput and uptime so far")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    return _save(fig, path)


def timelines(record: RunRecord, path: Path) -> Path:
    """One run: learners up (bars) above its merges (fragment x time, coloured by learners admitted)."""
    plt = _pyplot()
    intervals = learner_intervals(record)
    points = merges(record)
    fragments = max((p.fragment for p in points), default=0) + 1
    fig, (top, bottom) = plt.subplots(
        2,
        1,
        figsize=(8, 2 + 0.25 * (len(intervals) + fragments)),
        sharex=True,
        layout="constrained",
        gridspec_kw={"height_ratios": [max(1, len(intervals)), max(1, fragments)]},
    )
    for m, spans in sorted(intervals.items()):
        top.broken_barh([(a, b - a) for a, b in spans], (m - 0.4, 0.8), color="tab:green")
    top.set_yticks(sorted(intervals))
    top.set_ylabel("learner")
    top.set_title(f"{record.label}: learners up (green) and merges")
    top.set_xlim(0, max(run_end(record), 1e-9))
    if points:
        sc = bottom.scatter(
            [p.t for p in points],
            [p.fragment for p in points],
            c=[p.admitted for p in points],
            cmap="viridis",
            s=12,
            vmin=0,
            vmax=max(max(p.admitted for p in points), 1),
        )
        fig.colorbar(sc, ax=[top, bottom], label="learners admitted", pad=0.01)  # both keep one width
    bottom.set_yticks(range(fragments) if fragments <= 12 else range(0, fragments, max(1, fragments // 8)))
    bottom.set_ylabel("fragment")
    bottom.set_xlabel("seconds since start")
    return _save(fig, path)


def _save(fig, path: Path) -> Path:  # noqa: ANN001 - a matplotlib Figure
    if not fig.get_layout_engine():
        fig.tight_layout()
    fig.savefig(path, dpi=110)
    import matplotlib.pyplot as plt

    plt.close(fig)
    return path


def write_figures(records: Sequence[RunRecord], out: Path) -> list[Path]:
    out.mkdir(parents=True, exist_ok=True)
    paths = [
        loss_curves(records, "tokens", out / "loss_vs_tokens.png"),
        loss_curves(records, "t", out / "loss_vs_time.png"),
        goodput_curves(records, out / "goodput.png"),
    ]
    for i, r in enumerate(records):
        paths.append(timelines(r, out / f"timeline_{i}_{r.path.name}.png"))
    return paths
