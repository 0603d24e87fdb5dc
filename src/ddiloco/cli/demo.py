"""`ddiloco demo`: Decoupled DiLoCo against elastic data-parallel on one failure trace, side by side.

Both train the same model on the same data to the same token budget on the virtual clock, with the
same learners failing at the same moments. Each keeps a run directory; the report overlays them.
"""

from __future__ import annotations

import bisect
import dataclasses
import json
import time
from pathlib import Path
from typing import TYPE_CHECKING

import typer

from . import app, options

if TYPE_CHECKING:
    from ..sim.config import Method

METHODS: tuple[Method, ...] = ("decoupled", "elastic-ddp")


def loss_at(metrics: list[dict], t: float) -> float | None:
    """A run's eval loss at time t, interpolated between its eval points (None before the first)."""
    points = [(m["t"], m["eval_loss"]) for m in metrics if m.get("kind") == "eval"]
    if not points or t < points[0][0]:
        return None
    times = [p[0] for p in points]
    i = bisect.bisect_right(times, t)
    if i >= len(points):
        return points[-1][1]
    (t0, y0), (t1, y1) = points[i - 1], points[i]
    return y0 if t1 == t0 else y0 + (y1 - y0) * (t - t0) / (t1 - t0)


def interpretation(d: dict, e: dict) -> str:
    """One sentence on what the two runs show, from their numbers."""
    faster = e["sim_seconds"] / d["sim_seconds"] if d["sim_seconds"] > 0 else float("nan")
    text = (
        f"Under the same failures Decoupled DiLoCo kept {d['goodput']:.0%} of the learners' time useful "
        f"against {e['goodput']:.0%} for elastic data-parallel, and reached the token budget "
        f"{faster:.1f}x sooner ({d['sim_seconds']:.0f} s against {e['sim_seconds']:.0f} s)"
    )
    at_same_time = e.get("eval_loss_at_decoupled_end")
    if at_same_time is not None:
        text += (
            f"; when it finished, elastic data-parallel was at eval loss {at_same_time:.3f} against its "
            f"{d['eval_loss']:.3f}"
        )
    gap = d["eval_loss"] / e["eval_loss"] - 1
    if gap > 0.005:
        text += (
            f"; at equal tokens it ends {gap:.1%} above elastic data-parallel's loss "
            f"({d['eval_loss']:.3f} against {e['eval_loss']:.3f}), the price of merging every "
            f"{d['sync_every']} steps at this small scale (docs/results.md)"
        )
    return text + "."


@app.command("demo")
def demo(
    data: str | None = typer.Option(
        None, help="Text file or folder; default: Python's own standard library source (nothing is downloaded)."
    ),
    out: Path | None = typer.Option(
        None, help="Folder for the two run directories and the report (default runs/demo-<time>)."
    ),
    tokens: int = typer.Option(400_000, min=10_000, max=10**9, help="Token budget of each run."),
    learners: int = typer.Option(4, "--learners", "-M", min=2, max=64, help="Learners M."),
    fail_mtbf: float = typer.Option(30.0, min=1.0, help="Mean simulated seconds between a learner's failures."),
    fail_downtime: float = typer.Option(8.0, min=0.1, help="Mean simulated seconds a failed learner stays down."),
    model_size: options.ModelSize = typer.Option(
        "default", help="default (~1M parameters) or tiny (seconds, for a check)."
    ),
    seed: int = typer.Option(0, help="Seed of the model, the data order and the failures."),
    as_json: bool = typer.Option(False, "--json", help="End with one line of JSON holding both summaries."),
    quiet: bool = typer.Option(False, help="No progress bars."),
) -> None:
    """Run Decoupled DiLoCo and elastic data-parallel on the same failures; print both and write the report."""
    from ..chaos.trace import random_trace
    from ..core.config import AlgorithmConfig
    from ..records.events import EventLog
    from ..records.rundir import RunDir, load_run
    from ..report.page import write_page
    from ..report.plots import write_figures
    from ..sim.config import SimConfig
    from ..sim.recorder import SimRecorder
    from ..sim.run import build_task, run_sim
    from ..train.inner import InnerConfig
    from .output import print_table, progress_bar, user_error

    (model_size,) = options.plain(model_size)
    out = out or Path("runs") / time.strftime("demo-%Y%m%d-%H%M%S")
    batch, seq_len = 8, 64
    horizon = 8.0 * tokens / (learners * batch * seq_len)  # far beyond either run's end at one step a second
    trace = random_trace(learners, horizon, fail_mtbf, fail_downtime, seed=seed + 1)
    base = SimConfig(
        model_size=model_size,
        data=data,
        seq_len=seq_len,
        learners=learners,
        tokens=tokens,
        seed=seed,
        # A few dozen outer steps from scratch: plain averaging steps (lr 1, no momentum) suit
        # them better than the defaults tuned for long runs (docs/report.md).
        algorithm=AlgorithmConfig(fragments=4, sync_every=12, overlap=2, outer_lr=1.0, outer_momentum=0.0),
        inner=InnerConfig(batch_size=batch),
        failures=trace,
    )
    try:
        task = build_task(base)
        dirs = {m: RunDir(out / m) for m in METHODS}
    except (ValueError, FileNotFoundError, NotADirectoryError) as exc:
        raise user_error(exc) from None
    results = {}
    for method in METHODS:
        config = dataclasses.replace(base, method=method)
        record = dirs[method]
        record.write_config("sim", config, clock_origin=0.0)
        metrics = record.metrics()
        with EventLog(record.events_path, append=False) as log, progress_bar(method, disabled=quiet) as update:
            recorder = SimRecorder(metrics, task, tokens, eval_batches=config.eval_batches, forward=update)
            results[method] = run_sim(config, task=task, progress=recorder, observer=log.observe)
        metrics.close()
        record.write_summary(results[method])
    runs = [load_run(out / m) for m in METHODS]
    d, e = results["decoupled"], results["elastic-ddp"]
    e["eval_loss_at_decoupled_end"] = loss_at(runs[1].metrics, d["sim_seconds"])
    figures = write_figures(runs, out / "report")
    page = write_page(runs, figures, out / "report" / "report.html")
    print_table(
        {
            "goodput": (d["goodput"], e["goodput"]),
            "uptime": (d["uptime"], e["uptime"]),
            "simulated seconds to the budget": (d["sim_seconds"], e["sim_seconds"]),
            "eval loss at equal tokens": (d["eval_loss"], e["eval_loss"]),
            "eval loss when decoupled finished": (d["eval_loss"], e["eval_loss_at_decoupled_end"]),
        },
        columns=("Decoupled DiLoCo", "elastic DDP"),
        title=f"{learners} learners, each failing every {fail_mtbf:g} s for {fail_downtime:g} s on average",
    )
    typer.echo(interpretation(d, e))
    typer.echo(f"report: {page}")
    if as_json:
        print(json.dumps({"decoupled": d, "elastic-ddp": e, "report": str(page)}, sort_keys=True))
