"""Terminal output shared by the commands: a progress bar on stderr and a summary table."""

from __future__ import annotations

import contextlib
import re
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import cast

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


def print_summary(result: dict, title: str) -> None:
    table = Table(title=title, show_header=True, header_style="bold")
    table.add_column("metric")
    table.add_column("value", justify="right")
    for key, value in result.items():
        if key == "tokens_by_cause" and isinstance(value, dict):  # one row per cause: they add up to trained
            for cause, tokens in value.items():
                table.add_row(f"tokens {cause}", _fmt(tokens))
        if isinstance(value, (dict, list)):
            continue
        table.add_row(key, _fmt(value))
    stderr.print(table)


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
