"""`ddiloco demo`: the method's own scenario. Learners at distant sites that fail, trained four ways
on the very same failure trace and link: Decoupled DiLoCo, synchronous DiLoCo, data-parallel (DDP,
which restarts the job when a learner fails) and elastic data-parallel (which goes on without it).

All four train the same model on the same data to the same token budget on the virtual clock. The
sites are joined by a link scaled to the model (`scaled_link`): one data-parallel all-reduce of its
gradients takes as long as one step, as a 1B-parameter model's bf16 all-reduce does over about
30 Gbit/s; the paper's cross-region links (2-5 Gbit/s) would make it 6 to 16 steps. Each method keeps
a run directory; the report overlays them (loss against tokens and against time).
"""

from __future__ import annotations

import bisect
import dataclasses
import json
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import typer

from ..report.story import METHOD_NAMES as NAMES
from . import app, options
from ._flags import takes

if TYPE_CHECKING:
    from ..records.rundir import RunDir
    from ..sim.config import Method, SimConfig
    from ..sim.hardware import LinkModel
    from ..train.tasks import Task

METHODS: tuple[Method, ...] = ("decoupled", "diloco", "ddp", "elastic-ddp")


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


def scaled_link(params: int, latency: float, step_seconds: float = 1.0) -> LinkModel:
    """A link on which a ring all-reduce of `params` bf16 gradients (2 x 2 bytes a parameter through
    each link) takes `step_seconds`: the bytes-to-compute ratio of a large model across sites."""
    from ..sim.hardware import LinkModel

    return LinkModel(latency=latency, bandwidth=2 * params * 2.0 / step_seconds)


def interpretation(results: Mapping[str, dict]) -> str:
    """One sentence on what the runs show, computed from their numbers: the lowest eval loss at equal
    wall time (when the first run finished) and at equal tokens (each run's end)."""
    first = min(results, key=lambda m: results[m]["sim_seconds"])
    t = results[first]["sim_seconds"]
    at_time = {m: r.get("eval_loss_at_first_finish") for m, r in results.items()}
    known = {m: v for m, v in at_time.items() if v is not None}
    wall_winner = min(known, key=lambda m: known[m]) if known else first
    token_winner = min(results, key=lambda m: results[m]["eval_loss"])

    def others(losses: dict[str, float | None], winner: str) -> str:
        rest = [f"{NAMES[m]} {v:.3f}" if v is not None else f"{NAMES[m]} not yet evaluated" for m, v in losses.items()]
        return f"{losses[winner]:.3f}; " + ", ".join(x for x in rest if not x.startswith(NAMES[winner] + " "))

    return (
        f"At equal wall time ({t:.0f} simulated s, when {NAMES[first]} finished) {NAMES[wall_winner]} is lowest "
        f"in eval loss ({others(at_time, wall_winner)}); at equal tokens {NAMES[token_winner]} is lowest "
        f"({others({m: r['eval_loss'] for m, r in results.items()}, token_winner)})."
    )


def _train_each(base: SimConfig, task: Task, dirs: Mapping[Method, RunDir], quiet: bool) -> dict[str, dict]:
    """Each method on the virtual clock from the same config, into its own run directory; their summaries."""
    from ..records.events import EventLog
    from ..sim.recorder import SimRecorder
    from ..sim.run import run_sim
    from .output import progress_bar

    results: dict[str, dict] = {}
    for method in METHODS:
        config = dataclasses.replace(base, method=method)
        record = dirs[method]
        record.write_config("sim", config, clock_origin=0.0)
        metrics = record.metrics()
        with EventLog(record.events_path, append=False) as log, progress_bar(method, disabled=quiet) as update:
            recorder = SimRecorder(metrics, task, base.tokens, eval_batches=config.eval_batches, forward=update)
            results[method] = run_sim(config, task=task, progress=recorder, observer=log.observe)
        metrics.close()
        record.write_summary(results[method])
    return results


@dataclass(frozen=True)
class DemoFlags:
    """The flags of `ddiloco demo`: one field per flag (`_flags.takes`)."""

    data: str | None = typer.Option(
        None, help="Text file or folder; default: Python's own standard library source (nothing is downloaded)."
    )
    out: Path | None = typer.Option(
        None, help="Folder for the four run directories and the report (default runs/demo-<time>)."
    )
    tokens: int = typer.Option(400_000, min=10_000, max=10**9, help="Token budget of each run.")
    learners: int = typer.Option(4, "--learners", "-M", min=2, max=64, help="Learners M, one per site.")
    fail_mtbf: float = typer.Option(30.0, min=1.0, help="Mean simulated seconds between a learner's failures.")
    fail_downtime: float = typer.Option(8.0, min=0.1, help="Mean simulated seconds a failed learner stays down.")
    link_latency: float = typer.Option(
        0.05, min=0.0, max=10.0, help="One-way latency between sites, simulated seconds (a step takes 1)."
    )
    model_size: options.ModelSize = typer.Option(
        "default", help="default (~1M parameters) or tiny (seconds, for a check)."
    )
    seed: int = typer.Option(0, help="Seed of the model, the data order and the failures.")
    as_json: bool = typer.Option(False, "--json", help="End with one line of JSON holding every summary.")
    quiet: bool = typer.Option(False, help="No progress bars.")


@app.command("demo")
@takes(DemoFlags)
def demo(flags: DemoFlags) -> None:
    """Four methods across distant sites on the same failures and link; print them and write the report."""
    from ..chaos.trace import random_trace
    from ..core.config import AlgorithmConfig
    from ..records.rundir import RunDir, RunRecord, load_run
    from ..report.page import write_page
    from ..report.plots import write_figures
    from ..report.story import Story
    from ..sim.config import SimConfig
    from ..sim.run import build_task
    from ..train.inner import InnerConfig
    from .output import print_table, user_error

    (model_size,) = options.plain(flags.model_size)
    out = flags.out or Path("runs") / time.strftime("demo-%Y%m%d-%H%M%S")
    batch, seq_len = 8, 64
    horizon = 16.0 * flags.tokens / (flags.learners * batch * seq_len)  # far beyond any run's end at one step a second
    trace = random_trace(flags.learners, horizon, flags.fail_mtbf, flags.fail_downtime, seed=flags.seed + 1)
    base = SimConfig(
        model_size=model_size,
        data=flags.data,
        seq_len=seq_len,
        learners=flags.learners,
        tokens=flags.tokens,
        seed=flags.seed,
        # A few dozen outer steps from scratch: plain averaging steps (lr 1, no momentum) suit
        # them better than the defaults tuned for long runs (docs/report.md).
        algorithm=AlgorithmConfig(fragments=4, sync_every=12, overlap=2, outer_lr=1.0, outer_momentum=0.0),
        inner=InnerConfig(batch_size=batch),
        failures=trace,
    )
    try:
        task = build_task(base)
        params = sum(p.numel() for p in task.build_model(flags.seed).parameters())
        base = dataclasses.replace(base, link=scaled_link(params, flags.link_latency))
        dirs = {m: RunDir(out / m) for m in METHODS}
    except (ValueError, FileNotFoundError, NotADirectoryError) as exc:
        raise user_error(exc) from None
    results = _train_each(base, task, dirs, flags.quiet)
    runs: dict[str, RunRecord] = {m: load_run(out / m) for m in METHODS}
    first_finish = min(r["sim_seconds"] for r in results.values())
    for m, r in results.items():
        r["eval_loss_at_first_finish"] = loss_at(runs[m].metrics, first_finish)
    title = (
        f"{flags.learners} learners at distant sites ({flags.link_latency * 1000:g} ms one way; one all-reduce takes a "
        f"step), each failing every {flags.fail_mtbf:g} s for {flags.fail_downtime:g} s on average"
    )
    first_name = NAMES[min(results, key=lambda m: results[m]["sim_seconds"])]
    story = Story(
        scenario=f"{title}: the same model, data, token budget, failures and link for all four methods.",
        headline=interpretation(results),
        moment=first_finish,
        moment_label=f"{first_finish:.0f} s, when {first_name} finished",
    )
    story.save(out)
    figures = write_figures(list(runs.values()), out / "report", story)
    page = write_page(list(runs.values()), figures, out / "report" / "report.html", story)
    rows = {
        "goodput": "goodput",
        "uptime": "uptime",
        "simulated seconds to the budget": "sim_seconds",
        "eval loss at equal tokens": "eval_loss",
        f"eval loss at {first_finish:.0f} s (first to finish)": "eval_loss_at_first_finish",
    }
    print_table(
        {label: tuple(results[m][key] for m in METHODS) for label, key in rows.items()},
        columns=tuple(NAMES[m] for m in METHODS),
        title=title,
    )
    typer.echo(story.headline)
    typer.echo(f"report: {page}")
    if flags.as_json:
        print(json.dumps({**results, "report": str(page)}, sort_keys=True))
