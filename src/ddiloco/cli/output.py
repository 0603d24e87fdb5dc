"""Terminal output shared by the commands: a progress bar on stderr and a summary table."""

from __future__ import annotations

import contextlib
import json
import sys
from pathlib import Path
from typing import Callable, Iterator, TextIO

from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn
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


class EventLog:
    """JSON lines, one event per line, flushed as they come so a crash loses nothing written so far.

    Tensors and other non-JSON values in an event's details are left out.
    """

    def __init__(self, path: Path | None) -> None:
        self.path = path
        self._file: TextIO | None = None

    def __enter__(self) -> "EventLog":
        if self.path is not None:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._file = self.path.open("w")
        return self

    def __exit__(self, *exc: object) -> None:
        if self._file is not None:
            self._file.close()

    def write(self, kind: str, time: float, details: dict) -> None:
        if self._file is None:
            return
        record = {"event": kind, "time": round(time, 6)}
        record.update({k: v for k, v in details.items() if isinstance(v, (int, float, str, list, type(None)))})
        self._file.write(json.dumps(record) + "\n")
        self._file.flush()
