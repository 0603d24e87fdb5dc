"""Terminal output shared by the commands: a progress bar on stderr and a summary table."""

from __future__ import annotations

import contextlib
import sys
from typing import Callable, Iterator

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
