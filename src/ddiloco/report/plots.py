"""The report's figures, one function each; several runs share the loss and goodput axes. Each run is
one colour and one legend entry (its method's name); the loss axes are zoomed to where the runs differ,
and say so; the moment a story's headline refers to is marked."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from ..records.rundir import RunRecord
from .story import Story, labels
from .timeline import generations, learner_intervals, merges, run_end

FOCUS_SKIP = 0.15  # the first 15 % of each curve (the initial drop) does not set the loss axis


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")  # no display needed
    import matplotlib.pyplot as plt

    return plt


def _series(record: RunRecord, kind: str, key: str, x: str) -> tuple[list[float], list[float]]:
    points = [(m[x], m[key]) for m in record.metrics if m.get("kind") == kind and key in m]
    return [p[0] for p in points], [p[1] for p in points]


def focus(curves: Sequence[tuple[list[float], list[float]]]) -> tuple[float, float] | None:
    """The y range where the curves differ: every point past the first FOCUS_SKIP of its curve's x
    span, padded by 8 %. None when there is nothing to focus on."""
    kept = []
    for xs, ys in curves:
        if xs:
            start = xs[0] + FOCUS_SKIP * (xs[-1] - xs[0])
            kept += [y for x, y in zip(xs, ys, strict=True) if x >= start]
    if not kept:
        return None
    lo, hi = min(kept), max(kept)
    pad = 0.08 * (hi - lo) if hi > lo else 0.05 * abs(hi) or 0.1
    return lo - pad, hi + pad


def loss_curves(records: Sequence[RunRecord], x: str, path: Path, story: Story | None = None) -> Path:
    """Eval loss of the global model (solid, in the legend) and training loss (dotted, same colour)
    against tokens or time; with a story, its moment is a dashed vertical line on the time plot."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(7.5, 4.2))
    evals = []
    everything = []
    for i, (r, name) in enumerate(zip(records, labels(records), strict=True)):
        color = f"C{i}"
        xs, ys = _series(r, "eval", "eval_loss", x)
        if xs:
            ax.plot(xs, ys, "-o", color=color, markersize=3, label=name)
            evals.append((xs, ys))
            everything += ys
        xs, ys = _series(r, "train", "train_loss", x)
        if xs:
            ax.plot(xs, ys, ":", color=color, alpha=0.6)
            everything += ys
    title = f"Loss against {'tokens' if x == 'tokens' else 'time'} (solid: eval, dotted: training)"
    window = focus(evals)
    if window is not None:
        ax.set_ylim(*window)
        if any(y > window[1] for y in everything):
            title += "\naxis zoomed to where the runs differ: the first steps lie above it"
    if story is not None and story.moment is not None and x == "t":
        ax.axvline(story.moment, color="0.3", linestyle="--", linewidth=1)
        ax.annotate(
            story.moment_label or f"{story.moment:.0f} s",
            xy=(story.moment, 1.0),
            xycoords=("data", "axes fraction"),
            xytext=(4, -12),
            textcoords="offset points",
            fontsize=8,
            color="0.3",
        )
    ax.set_xlabel("tokens trained" if x == "tokens" else "seconds since start")
    ax.set_ylabel("loss (nats per token)")
    ax.set_title(title, fontsize=10)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    return _save(fig, path)


def goodput_curves(records: Sequence[RunRecord], path: Path) -> Path:
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(7.5, 3.6))
    for i, (r, name) in enumerate(zip(records, labels(records), strict=True)):
        for key, style in (("goodput", "-"), ("uptime", "--")):
            xs, ys = _series(r, "progress", key, "t")
            if xs:
                ax.plot(xs, ys, style, color=f"C{i}", label=name if key == "goodput" else None)
    ax.set_ylim(0, 1.05)
    ax.set_xlabel("seconds since start")
    ax.set_ylabel("fraction")
    ax.set_title("Goodput (solid) and uptime (dashed) so far", fontsize=10)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    return _save(fig, path)


def timelines(record: RunRecord, name: str, path: Path) -> Path:
    """One run: learners up (bars) above its merges (fragment x time, coloured by learners admitted),
    or, for data-parallel, the workers all-reducing together (0 while the job stalls)."""
    from matplotlib.ticker import MaxNLocator

    plt = _pyplot()
    intervals = learner_intervals(record)
    points = merges(record)
    gens = generations(record)
    fragments = max((p.fragment for p in points), default=0) + 1
    rows = fragments if points or not gens else 3
    fig, (top, bottom) = plt.subplots(
        2,
        1,
        figsize=(8, 2 + 0.25 * (len(intervals) + rows)),
        sharex=True,
        layout="constrained",
        gridspec_kw={"height_ratios": [max(1, len(intervals)), max(1, rows)]},
    )
    end = max(run_end(record), 1e-9)
    for m, spans in sorted(intervals.items()):
        top.broken_barh([(a, b - a) for a, b in spans], (m - 0.4, 0.8), color="tab:green")
    top.set_yticks(sorted(intervals))
    top.set_ylabel("learner")
    top.set_xlim(0, end)
    if points:
        top.set_title(f"{name}: learners up (green) and merges", fontsize=10)
        most = max(max(p.admitted for p in points), 1)
        sc = bottom.scatter(
            [p.t for p in points],
            [p.fragment for p in points],
            c=[p.admitted for p in points],
            cmap=plt.get_cmap("viridis", most + 1),
            s=12,
            vmin=-0.5,
            vmax=most + 0.5,
        )
        bar = fig.colorbar(sc, ax=[top, bottom], label="learners admitted", pad=0.01)  # both keep one width
        bar.set_ticks(range(most + 1))
        bottom.set_yticks(range(fragments) if fragments <= 12 else range(0, fragments, max(1, fragments // 8)))
        bottom.set_ylabel("fragment")
    elif gens:
        top.set_title(f"{name}: learners up (green) and workers all-reducing together", fontsize=10)
        bottom.step([g.t for g in gens] + [end], [g.size for g in gens] + [gens[-1].size], where="post")
        bottom.set_ylim(-0.3, max(len(intervals), max(g.size for g in gens)) + 0.3)
        bottom.yaxis.set_major_locator(MaxNLocator(integer=True))
        bottom.set_ylabel("workers")
    else:
        top.set_title(f"{name}: learners up (green); no merges recorded", fontsize=10)
    bottom.set_xlabel("seconds since start")
    return _save(fig, path)


def _save(fig, path: Path) -> Path:  # noqa: ANN001 - a matplotlib Figure
    if not fig.get_layout_engine():
        fig.tight_layout()
    fig.savefig(path, dpi=110)
    import matplotlib.pyplot as plt

    plt.close(fig)
    return path


def write_figures(records: Sequence[RunRecord], out: Path, story: Story | None = None) -> list[Path]:
    out.mkdir(parents=True, exist_ok=True)
    paths = [
        loss_curves(records, "tokens", out / "loss_vs_tokens.png"),
        loss_curves(records, "t", out / "loss_vs_time.png", story),
        goodput_curves(records, out / "goodput.png"),
    ]
    for i, (r, name) in enumerate(zip(records, labels(records), strict=True)):
        paths.append(timelines(r, name, out / f"timeline_{i}_{r.path.name}.png"))
    return paths
