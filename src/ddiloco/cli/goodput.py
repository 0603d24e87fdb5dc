"""`ddiloco goodput`: chaos simulation of goodput and uptime at chip scale.

See docs/goodput.md for the model, the defaults and their reasons, and the calibration.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import typer
from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table
from typer.core import TyperCommand

from ddiloco.cli import app
from ddiloco.cli._flags import takes
from ddiloco.cli.output import user_error
from ddiloco.goodput.config import REPAIR_DISTRIBUTIONS, GoodputConfig
from ddiloco.goodput.failures import sample_outages, slice_sizes
from ddiloco.goodput.result import METHODS
from ddiloco.goodput.runner import RunReport, Summary, run, seed_rngs

_D = GoodputConfig()  # the single source of the defaults shown in --help

LIST_OPTIONS = ("--chips", "--learners", "--methods")
_VALUE = re.compile(r"^(?!-)|^-\d")  # a value, not an option: no leading dash, or a negative number


class SpaceSeparatedLists(TyperCommand):
    """Let `--chips 150000 300000` mean `--chips 150000 --chips 300000` (argparse's nargs='+')."""

    def parse_args(self, ctx: Any, args: list[str]) -> list[str]:
        out: list[str] = []
        i = 0
        while i < len(args):
            arg = args[i]
            if arg == "--":
                out.extend(args[i:])
                break
            if arg in LIST_OPTIONS:
                values = []
                while i + 1 < len(args) and _VALUE.match(args[i + 1]) and args[i + 1] != "--":
                    values.append(args[i + 1])
                    i += 1
                for v in values:
                    out.extend((arg, v))
                if not values:
                    out.append(arg)  # click then says the option needs a value
            else:
                out.append(arg)
            i += 1
        return super().parse_args(ctx, out)


def _check(condition: bool, message: str, hint: str) -> None:
    if not condition:
        raise typer.BadParameter(message, param_hint=hint)


def _validate(chips: list[int], learners: list[int], methods: list[str], config: GoodputConfig) -> None:
    for n in chips:
        _check(n >= 1, f"chip counts must be >= 1, got {n}", "--chips")
    for m in learners:
        _check(m >= 1, f"learner counts must be >= 1, got {m}", "--learners")
    for name in methods:
        _check(name in METHODS, f"unknown method {name!r}; choose from {', '.join(METHODS)}", "--methods")
    if any(m in methods for m in ("diloco", "decoupled")):
        _check(
            config.quorum <= min(learners),
            f"quorum K={config.quorum} exceeds the smallest learner count {min(learners)}",
            "--quorum",
        )
        for n in chips:
            slices = slice_sizes(n, config.slice_chips).size
            _check(
                slices >= max(learners),
                f"{n} chips make {slices} slices of {config.slice_chips}; "
                f"{max(learners)} learners need at least one slice each",
                "--learners",
            )


def _table(rows: list[Summary], config: GoodputConfig, wall: float) -> Table:
    table = Table(
        title=f"Goodput under failures (MTBI {config.mtbi_years:g} y/chip, "
        f"{config.days:g} days, {rows[0].seeds} seed(s), 95 % CI)"
    )
    for col, justify in (
        ("chips", "right"),
        ("method", "left"),
        ("M", "right"),
        ("goodput %", "right"),
        ("uptime %", "right"),
    ):
        table.add_column(col, justify=justify)  # type: ignore[arg-type]
    last_chips = None
    for r in rows:
        if last_chips is not None and r.chips != last_chips:
            table.add_section()
        last_chips = r.chips
        table.add_row(
            f"{r.chips:,}",
            r.method,
            str(r.learners),
            f"{100 * r.goodput:5.1f} ± {100 * r.goodput_ci:.1f}",
            f"{100 * r.uptime:6.2f}",
        )
    table.caption = f"simulated in {wall:.2f} s"
    return table


def _json_line(
    report: RunReport, config: GoodputConfig, chips: list[int], learners: list[int], seeds: int, first_seed: int
) -> str:
    payload = {
        "results": [r.as_json() for r in report.rows],
        "sim_wall_seconds": round(report.wall_seconds, 3),
        "chips": chips,
        "learners": learners,
        "seeds": seeds,
        "first_seed": first_seed,
        "config": config.as_dict(),
    }
    return json.dumps(payload, separators=(",", ":"))


@dataclass(frozen=True)
class GoodputFlags:
    """The flags of `ddiloco goodput`: one field per flag (`_flags.takes`)."""

    chips: list[int] = typer.Option(
        [1_200_000], "--chips", metavar="N [N ...]", help="Chip counts to simulate (space-separated)."
    )
    learners: list[int] = typer.Option(
        [2, 4, 8, 16], "--learners", metavar="M [M ...]", help="Learner counts for diloco and decoupled."
    )
    mtbi_years: float = typer.Option(_D.mtbi_years, help="Mean time between interruptions of one chip, years.")
    seeds: int = typer.Option(5, help="Independent failure draws per chip count (confidence interval).")
    seed: int = typer.Option(0, help="First seed; seeds are seed, seed+1, ...")
    days: float = typer.Option(_D.days, help="Simulated wall-clock days.")
    methods: list[str] = typer.Option(
        list(METHODS), "--methods", metavar="NAME [NAME ...]", help="Methods: ddp elastic-ddp diloco decoupled."
    )
    slice_chips: int = typer.Option(_D.slice_chips, help="Chips per slice (fail and return together).")
    repair_dist: str = typer.Option(_D.repair_dist, help=f"Repair time: {', '.join(REPAIR_DISTRIBUTIONS)}.")
    repair_mean_hours: float = typer.Option(_D.repair_mean_hours, help="Mean repair time of a slice, hours.")
    repair_sigma: float = typer.Option(_D.repair_sigma, help="Lognormal shape (sigma of the log).")
    detect_seconds: float = typer.Option(_D.detect_s, help="Failure detection time (all methods).")
    reconfig_seconds: float = typer.Option(
        _D.reconfig_s, "--reconfigure-seconds", help="Elastic pause to drop a failed slice."
    )
    scaleup_seconds: float = typer.Option(_D.scaleup_s, help="Elastic pause to take a repaired slice back.")
    restart_seconds: float = typer.Option(_D.restart_s, help="ddp: restart on a spare after detection.")
    checkpoint_seconds: float = typer.Option(_D.checkpoint_s, help="ddp: checkpoint interval.")
    step_seconds: float = typer.Option(
        _D.step_s, "--step-time", help="Training step time; a failure loses the step in flight."
    )
    step_cv: float = typer.Option(_D.step_cv, help="Coefficient of variation of a learner's step time.")
    inner_steps: int = typer.Option(_D.inner_steps, "--sync-every", "-H", help="H: inner steps per (fragment) sync.")
    tau: int = typer.Option(_D.overlap_steps, "--overlap", help="tau: steps a sync overlaps with compute.")
    quorum: int = typer.Option(_D.quorum, "--quorum", "-K", help="K: learners a decoupled merge needs.")
    rejoin_seconds: float = typer.Option(_D.rejoin_s, help="DiLoCo learner: extra pause to rejoin after a failure.")
    outer_sync_seconds: float = typer.Option(_D.outer_sync_s, help="diloco: blocking outer all-reduce time.")
    json_out: bool = typer.Option(False, "--json", help="Print one JSON object as the last line.")
    plot: Path | None = typer.Option(None, "--plot", metavar="FILE.png", help="Draw goodput against chips.")
    trace_out: Path | None = typer.Option(
        None, "--trace-out", metavar="FILE.csv", help="Write the learners' down/up trace (first chips, first seed)."
    )
    trace_learners: int | None = typer.Option(None, help="Learners in the trace (default: the first --learners value).")
    trace_scale: float = typer.Option(1.0, help="Simulated seconds per trace second (trace times = sim / scale).")


def _config(flags: GoodputFlags) -> GoodputConfig:
    """The simulation's settings from the flags; a bad value ends as the command line's error."""
    try:
        return GoodputConfig(
            mtbi_years=flags.mtbi_years,
            slice_chips=flags.slice_chips,
            repair_dist=flags.repair_dist,
            repair_mean_hours=flags.repair_mean_hours,
            repair_sigma=flags.repair_sigma,
            detect_s=flags.detect_seconds,
            reconfig_s=flags.reconfig_seconds,
            scaleup_s=flags.scaleup_seconds,
            restart_s=flags.restart_seconds,
            checkpoint_s=flags.checkpoint_seconds,
            step_s=flags.step_seconds,
            step_cv=flags.step_cv,
            inner_steps=flags.inner_steps,
            overlap_steps=flags.tau,
            quorum=flags.quorum,
            rejoin_s=flags.rejoin_seconds,
            outer_sync_s=flags.outer_sync_seconds,
            days=flags.days,
        )
    except ValueError as exc:
        raise user_error(exc) from None


@app.command("goodput", cls=SpaceSeparatedLists)
@takes(GoodputFlags)
def goodput(flags: GoodputFlags) -> None:
    """Simulate failures on a large cluster; report goodput and uptime of ddp, elastic-ddp,
    synchronous DiLoCo and Decoupled DiLoCo. Defaults reproduce the paper (MTBI 1 year, 1.2M chips)."""
    config = _config(flags)
    _check(flags.seeds >= 1, f"--seeds must be >= 1, got {flags.seeds}", "--seeds")
    _check(flags.trace_scale > 0, f"--trace-scale must be > 0, got {flags.trace_scale}", "--trace-scale")
    methods = list(dict.fromkeys(flags.methods))
    _validate(flags.chips, flags.learners, methods, config)
    if flags.trace_out is not None:
        m_trace = flags.learners[0] if flags.trace_learners is None else flags.trace_learners
        _check(m_trace >= 1, f"--trace-learners must be >= 1, got {m_trace}", "--trace-learners")
        _check(
            slice_sizes(flags.chips[0], config.slice_chips).size >= m_trace,
            f"{flags.chips[0]} chips have too few slices for {m_trace} learners",
            "--trace-learners",
        )

    console = Console()
    total = len(flags.chips) * flags.seeds
    with Progress(
        TextColumn("[progress.description]{task.description}"),
        BarColumn(),
        TextColumn("{task.completed}/{task.total}"),
        TimeElapsedColumn(),
        console=Console(stderr=True),
        transient=True,
    ) as progress:
        task = progress.add_task("simulating", total=total)

        def done(n: int, s: int) -> None:
            progress.update(task, advance=1, description=f"{n:,} chips, seed {s}")

        report = run(
            flags.chips, flags.learners, config, flags.seeds, first_seed=flags.seed, methods=methods, on_done=done
        )

    console.print(_table(report.rows, config, report.wall_seconds))
    console.print(
        f"sim_wall_seconds: {report.wall_seconds:.2f} "
        f"({len(flags.chips)} chip count(s) x {flags.seeds} seed(s), {config.days:g} simulated days)"
    )
    if flags.plot is not None:
        from ddiloco.goodput.plot import plot_goodput

        plot_goodput(report.rows, flags.plot, title=f"Goodput, MTBI {config.mtbi_years:g} y/chip")
        console.print(f"plot written to {flags.plot}")
    if flags.trace_out is not None:
        from ddiloco.goodput.trace_export import learner_trace

        fail_rng = seed_rngs(flags.chips[0], flags.seed)[0]
        trace = learner_trace(sample_outages(flags.chips[0], config, fail_rng), m_trace, config, flags.trace_scale)
        trace.save(flags.trace_out)
        console.print(
            f"trace of {m_trace} learners ({len(trace.outages)} outages, {flags.chips[0]:,} chips, "
            f"seed {flags.seed}, 1 trace s = {flags.trace_scale:g} simulated s) written to {flags.trace_out}"
        )
    if flags.json_out:
        print(_json_line(report, config, flags.chips, flags.learners, flags.seeds, flags.seed), flush=True)
