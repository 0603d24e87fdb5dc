"""Terminal output shared by the commands: a progress bar on stderr, a summary table, and what the
backends of `ddiloco run` say and leave (`TerminalOutput`, `finish`)."""

from __future__ import annotations

import contextlib
import json
import re
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, cast

import click
import typer
from rich.console import Console
from rich.progress import (
    BarColumn,
    Progress,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)
from rich.table import Table

if TYPE_CHECKING:
    from ..backends.base import Refused, Report

# Progress goes to stderr so that stdout stays clean for --json.
stderr = Console(stderr=True)
stdout = Console(file=sys.stdout, soft_wrap=True)


@contextlib.contextmanager
def progress_bar(label: str, disabled: bool = False) -> Iterator[Callable[[float, dict], None]]:
    """Yields update(fraction, info); info's 'loss' is shown next to the bar."""
    if disabled:
        yield lambda fraction, info: None
        return
    with Progress(
        TextColumn("[bold]{task.description}"),
        BarColumn(),
        TextColumn("{task.percentage:>5.1f}%"),
        TextColumn("{task.fields[status]}"),
        TimeElapsedColumn(),
        TimeRemainingColumn(),
        console=stderr,
        transient=False,
    ) as progress:
        task = progress.add_task(label, total=1.0, status="")
        last = [0.0]

        def update(fraction: float, info: dict) -> None:
            if fraction - last[0] >= 0.002 or fraction >= 1.0:
                last[0] = fraction
                status = f"loss {info['loss']:.3f}" if "loss" in info else ""
                progress.update(task, completed=fraction, status=status)

        yield update


def _fmt(value: object) -> str:
    if isinstance(value, float):
        return f"{value:.4g}"
    return str(value)


# The summary as a person reads it: sections of labelled rows, in the units people use. Every field,
# these and the rest, is in the run's summary.json and the --json line.
SUMMARY_ROWS: tuple[tuple[str, tuple[tuple[str, str, str], ...]], ...] = (
    (
        "run",
        (
            ("method", "method", "text"),
            ("model", "model", "text"),
            ("params", "parameters", "int"),
            ("learners", "learners", "int"),
            ("backend", "backend", "text"),
            ("seed", "seed", "int"),
        ),
    ),
    (
        "algorithm",
        (
            ("fragments", "fragments (P)", "int"),
            ("sync_every", "steps between syncs (H)", "int"),
            ("overlap", "overlap (tau)", "text"),
            ("quorum", "quorum (K)", "int"),
            ("grace", "grace window", "float"),
            ("merge", "merge", "text"),
            ("late", "late work", "text"),
        ),
    ),
    (
        "result",
        (
            ("eval_loss", "eval loss", "loss"),
            ("goodput", "goodput", "pct"),
            ("uptime", "uptime", "pct"),
            ("availability", "availability", "pct"),
            ("run_seconds", "run time", "seconds"),
            ("sim_seconds", "simulated time", "seconds"),
            ("wall_seconds", "wall time (with start-up)", "seconds"),
            ("longest_gap_seconds", "longest time without a merge", "seconds"),
        ),
    ),
    (
        "tokens",
        (
            ("tokens_trained", "trained", "int"),
            ("tokens_merged", "merged into the model", "int"),
            ("tokens_lost", "lost", "int"),
        ),
    ),
    (
        "syncs",
        (
            ("outer_steps", "outer steps", "int"),
            ("inner_steps", "inner steps", "int"),
            ("contributions", "contributions merged", "int"),
            ("rejected_contributions", "contributions refused", "int"),
            ("double_merged_steps", "steps merged twice (must be 0)", "int"),
        ),
    ),
    (
        "faults",
        (
            ("learner_restarts", "learner restarts", "int"),
            ("synchronizer_restarts", "synchronizer restarts", "int"),
            ("job_restarts", "job restarts", "int"),
            ("generations", "generations (data-parallel)", "int"),
            ("failed_steps", "failed steps", "int"),
        ),
    ),
    (
        "network",
        (
            ("bytes_up_per_step", "bytes up per learner step", "bytes"),
            ("bytes_down_per_step", "bytes down per learner step", "bytes"),
            ("bandwidth_ratio_both_ways", "x fewer than bf16 all-reduce", "float"),
            ("link_seconds_per_step", "link seconds per step", "seconds"),
        ),
    ),
)
LOST_CAUSES = ("overwritten", "refused", "unsent", "in_transit")


def _human(value: object, kind: str) -> str:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return str(value)
    if kind == "int":
        return f"{round(value):,}"
    if kind == "pct":
        return f"{100 * value:.1f} %"
    if kind == "seconds":
        return f"{value:.3g} s" if value < 100 else f"{value:,.0f} s"
    if kind == "bytes":
        for unit, size in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
            if value >= size:
                return f"{value / size:.3g} {unit}"
        return f"{value:.0f} B"
    if kind == "loss":
        return f"{value:.4f}"
    return f"{value:.4g}"


def summary_table(result: dict, title: str) -> Table:
    """The run's summary in sections of labelled rows (`SUMMARY_ROWS`); absent fields are left out,
    and tokens lost by cause only where some were."""
    result = dict(result)
    if result.get("run_seconds") is not None:  # a real run's is the same figure
        result.pop("sim_seconds", None)
    result.setdefault("tokens_trained", result.get("tokens"))  # `ddiloco sim` calls them tokens
    where = f"every field: {result['run_dir']}/summary.json, or --json" if result.get("run_dir") else None
    table = Table(title=title, caption=where, show_header=False, title_style="bold")
    table.add_column("", style="dim")
    table.add_column("")
    table.add_column("", justify="right")
    by_cause = result.get("tokens_by_cause")
    causes: dict = by_cause if isinstance(by_cause, dict) else {}
    for section, rows in SUMMARY_ROWS:
        shown = [(label, _human(result[key], kind)) for key, label, kind in rows if result.get(key) is not None]
        if section == "tokens":
            budget = result.get("tokens_budget")
            if isinstance(budget, (int, float)) and budget > 0:
                shown.insert(0, ("budget", _human(budget, "int")))
            shown += [
                (f"  of which {cause.replace('_', ' ')}", _human(causes[cause], "int"))
                for cause in LOST_CAUSES
                if isinstance(causes.get(cause), (int, float)) and causes[cause] > 0
            ]
        for i, (label, value) in enumerate(shown):
            table.add_row(section if i == 0 else "", label, value)
        if shown:
            table.add_section()
    return table


def print_summary(result: dict, title: str) -> None:
    stderr.print(summary_table(result, title))


def print_table(rows: dict[str, tuple], columns: tuple[str, ...], title: str) -> None:
    """Runs side by side: one row per metric, one column per run (on stdout: it is the result)."""
    table = Table(title=title, show_header=True, header_style="bold")
    table.add_column("")
    for c in columns:
        table.add_column(c, justify="right")
    for name, values in rows.items():
        table.add_row(name, *("-" if v is None else _fmt(v) for v in values))
    stdout.print(table)


# Config fields whose flag is not their name with dashes (goodput's knobs are in seconds, its H is -H).
FIELD_FLAGS = {
    "overlap_steps": "--overlap",
    "inner_steps": "--sync-every",
    "step_s": "--step-time",
    "reconfig_s": "--reconfigure-seconds",
    "detect_s": "--detect-seconds",
    "scaleup_s": "--scaleup-seconds",
    "restart_s": "--restart-seconds",
    "checkpoint_s": "--checkpoint-seconds",
    "rejoin_s": "--rejoin-seconds",
    "outer_sync_s": "--outer-sync-seconds",
    "step_cv": "--step-cv",
    "repair_dist": "--repair-dist",
}


def _current_context():  # noqa: ANN202 - a click Context
    """The running command's context: recent typer versions carry their own copy of click."""
    try:
        from typer._click.globals import get_current_context
    except ImportError:
        get_current_context = click.get_current_context  # type: ignore[assignment]  # click's, where typer has no copy
    return get_current_context(silent=True)


def user_error(exc: Exception) -> typer.BadParameter:
    """A bad value's error in the command line's own words: `seq_len` becomes `--seq-len`."""
    message = str(exc)
    context = _current_context()
    names = dict(FIELD_FLAGS)
    if context is not None:
        for param in context.command.params:
            flags = [o for o in getattr(param, "opts", []) if o.startswith("--")]
            if flags and param.name and "_" in param.name:  # one-word names are English words too
                names.setdefault(param.name, flags[0])
    for name in sorted(names, key=len, reverse=True):
        message = re.sub(rf"(?<![\w-]){re.escape(name)}(?![\w-])", names[name], message)
    return typer.BadParameter(message)


def metric_sinks(
    tensorboard: Path | None,
    wandb: bool,
    wandb_mode: object,
    wandb_project: str,
    where: Path,
    name: str | None,
    config: object,
) -> list:
    """The sinks the flags ask for (TensorBoard, wandb), or exit code 2 naming the flag."""
    from ..records.sinks import TensorBoardSink, WandbSink

    sinks: list = []
    try:
        if tensorboard is not None:
            sinks.append(TensorBoardSink(tensorboard))
        if wandb:
            mode = getattr(wandb_mode, "value", wandb_mode)
            sinks.append(WandbSink(where, str(mode), wandb_project, name, cast(dict, config)))  # jsonable(settings)
    except ValueError as exc:
        for sink in sinks:
            sink.close()
        raise typer.BadParameter(str(exc), param_hint="--wandb" if "wandb" in str(exc) else "--tensorboard") from None
    return sinks


class _LiveView:
    """A local run's live view, redrawn in place on stderr."""

    def __init__(self) -> None:
        from rich.live import Live

        self._live = Live(console=stderr, refresh_per_second=2, transient=False)

    def start(self) -> None:
        self._live.start()

    def update(self, view: object) -> None:
        self._live.update(view)  # type: ignore[arg-type]  # launch.live.render's rich renderables

    def stop(self) -> None:
        self._live.stop()
        stderr.print()


class TerminalOutput:
    """What the backends of `ddiloco run` say (`backends.base.Output`), on stderr: stdout stays clean for
    --json. `live`: a live view of a local run (off with --quiet)."""

    def __init__(self, live: bool = True) -> None:
        self._live = live

    def say(self, text: str) -> None:
        stderr.print(text)

    def show(self, text: str) -> None:
        stderr.print(text, soft_wrap=True)

    def warn(self, text: str) -> None:
        stderr.print(f"[yellow]{text}[/]")

    def live(self) -> _LiveView | None:
        return _LiveView() if self._live else None


def refused(exc: Refused) -> typer.BadParameter:
    """A backend's `Refused`, in the command line's words (naming its flag where it names one)."""
    return typer.BadParameter(str(exc), param_hint=exc.flag) if exc.flag else user_error(exc)


def finish(report: Report, title: str, as_json: bool) -> None:
    """What a run left (`backends.base.Report`): its table on stderr, its error, its --json line on
    stdout; exit code 1 when it failed."""
    if report.table is not None:
        print_summary(report.table, title=title)
    if report.error:
        stderr.print(f"[red]error:[/red] {report.error}")
    if as_json:
        print(json.dumps(report.result, sort_keys=True), flush=True)
    if report.error:
        sys.exit(1)
