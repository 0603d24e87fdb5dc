"""A run directory holds a run's whole story, in one layout for `ddiloco sim` and `ddiloco run`:

    config.json     every setting, resolved defaults included, the command, versions, when it started
    summary.json    what `--json` prints at the end
    metrics.jsonl   one JSON object per line over the run: {"t", "tokens", "kind", ...}
                      kind "eval":  eval_loss (and eval_accuracy) of the global model
                      kind "train": train_loss, the learners' mean training loss since the last line
                      kind "progress": goodput, uptime, tokens_merged so far (where the driver knows them)
    events.jsonl    the event log (`records.events`, one schema for both)

Times: `t` in metrics.jsonl counts seconds from the run's start; in events.jsonl it is the event
log's own clock, and config.json's `clock_origin` turns it into the same count
(0 for the simulator's virtual clock, the start's wall time for the runtime). `ddiloco report`
reads any number of these folders.
"""

from __future__ import annotations

import dataclasses
import enum
import json
import platform
import sys
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import TextIO

from .atomic import atomic_write_json, read_json
from .events import read_events
from .sinks import Sink

CONFIG, SUMMARY, METRICS, EVENTS = "config.json", "summary.json", "metrics.jsonl", "events.jsonl"
METRIC_KINDS = ("eval", "train", "progress")


SECRET_KEYS = frozenset({"token", "secret", "password"})


REDACTED = "<redacted>"


def _secret_flag(arg: str) -> bool:
    """`--token`, `--wandb-token`, `--secret`...: a flag whose last word names a secret (`--tokens` does not)."""
    name = arg.split("=", 1)[0]
    return name.startswith("--") and name[2:].replace("_", "-").rsplit("-", 1)[-1] in SECRET_KEYS


def redact_argv(argv: Sequence[str]) -> list[str]:
    """A command line as it may be written down: the value of every secret-bearing flag replaced, in
    both spellings (`--token X`, `--token=X`), wherever it appears."""
    out: list[str] = []
    hide_next = False
    for arg in argv:
        if hide_next:
            out.append(REDACTED)
            hide_next = False
        elif _secret_flag(arg) and "=" in arg:
            out.append(arg.split("=", 1)[0] + "=" + REDACTED)
        else:
            out.append(arg)
            hide_next = _secret_flag(arg)
    return out


def _field(key: str, value: object) -> object:
    return REDACTED if key in SECRET_KEYS and value is not None else jsonable(value)


def jsonable(value: object) -> object:
    """Settings as JSON: dataclasses as dicts, paths and enums as text, tuples as lists, and secrets
    (the auth token) never written out."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: _field(f.name, getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, dict):
        return {str(k): _field(str(k), v) for k, v in value.items()}
    if isinstance(value, (list, tuple, set, frozenset)):
        return [jsonable(v) for v in value]
    if isinstance(value, enum.Enum):
        return jsonable(value.value)
    if isinstance(value, (str, int, float, bool)) or value is None:
        return value
    return str(value)


def versions() -> dict[str, str]:
    import torch

    from ..version import __version__

    return {
        "ddiloco": __version__,
        "torch": torch.__version__,
        "python": sys.version.split()[0],
        "platform": platform.platform(),
    }


class MetricsLog:
    """Appends metric records; flushed line by line, so a killed run keeps what it measured.

    Every numeric value also goes to each sink (`records.sinks`: TensorBoard, wandb).
    """

    def __init__(self, path: Path | None, sinks: Sequence[Sink] = ()) -> None:
        self._sinks = list(sinks)
        self._file: TextIO | None = open(path, "a", buffering=1) if path is not None else None
        self._lock = threading.Lock()

    def write(self, kind: str, t: float, tokens: float, **values: float | int | None) -> None:
        if kind not in METRIC_KINDS:
            raise ValueError(f"unknown metric kind {kind!r}; one of {METRIC_KINDS}")
        record = {
            "t": round(float(t), 6),
            "tokens": tokens,
            "kind": kind,
            **{k: v for k, v in values.items() if v is not None},
        }
        numbers = {k: v for k, v in values.items() if isinstance(v, (int, float)) and not isinstance(v, bool)}
        with self._lock:
            if self._file is not None:
                self._file.write(json.dumps(record) + "\n")
            for sink in self._sinks:
                sink.write(kind, tokens, numbers)

    def close(self) -> None:
        with self._lock:
            if self._file is not None:
                self._file.close()
                self._file = None
            for sink in self._sinks:
                sink.close()
            self._sinks = []


class RunDir:
    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        try:
            self.path.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise ValueError(f"run directory {self.path}: cannot create it ({exc.strerror})") from None

    @property
    def events_path(self) -> Path:
        return self.path / EVENTS

    def write_config(self, command: str, settings: object, clock_origin: float) -> None:
        atomic_write_json(
            self.path / CONFIG,
            {
                "command": command,
                "argv": redact_argv(sys.argv),  # `--token X` is a setting like any other here
                "settings": jsonable(settings),
                "versions": versions(),
                "started": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
                "clock_origin": clock_origin,
            },
            durable=False,
        )

    def write_summary(self, summary: dict) -> None:
        atomic_write_json(self.path / SUMMARY, summary, durable=False)

    def metrics(self, sinks: Sequence[Sink] = ()) -> MetricsLog:
        return MetricsLog(self.path / METRICS, sinks)


@dataclasses.dataclass
class RunRecord:
    """A finished (or killed) run, read back for reports."""

    path: Path
    config: dict
    summary: dict
    metrics: list[dict] = dataclasses.field(default_factory=list)
    events: list[dict] = dataclasses.field(default_factory=list)

    @property
    def label(self) -> str:
        s = self.config.get("settings", {})
        method = s.get("method", "?")
        return f"{method} ({self.path.name})"

    def event_time(self, event: dict) -> float:
        """An event's time in seconds since the run's start."""
        return float(event["t"]) - float(self.config.get("clock_origin", 0.0))


def run_dirs_in(path: str | Path) -> list[Path]:
    """`path` if it is a run directory, else the run directories directly inside it (the demo's folder
    holds one per method); ValueError when it is neither."""
    path = Path(path)
    if (path / CONFIG).is_file():
        return [path]
    if not path.is_dir():
        raise ValueError(f"{path}: no such directory")
    inside = sorted(d for d in path.iterdir() if (d / CONFIG).is_file())
    if not inside:
        raise ValueError(f"{path} is not a run directory (no {CONFIG}) nor a folder of them; make one with --run-dir")
    return inside


def _read_object(path: Path, key: str | None = None) -> dict:
    """A JSON file that must hold an object (and, with `key`, an object under that key)."""
    try:
        value = read_json(path)
    except UnicodeDecodeError as exc:
        raise ValueError(f"{path}: not a JSON file ({exc.reason} at byte {exc.start})") from None
    except (OSError, ValueError) as exc:
        raise ValueError(f"{path}: unreadable ({str(exc)[:200]})") from None
    if not isinstance(value, dict) or (key is not None and not isinstance(value.get(key, {}), dict)):
        what = "a JSON object" if key is None else f'a JSON object whose "{key}" is an object'
        raise ValueError(f"{path}: not a run's {path.name} (expected {what})")
    return value


def load_run(path: str | Path) -> RunRecord:
    """Read a run directory; a one-line error naming the file when it is not one, or is broken."""
    path = Path(path)
    if not (path / CONFIG).is_file():
        raise ValueError(f"{path} is not a run directory (no {CONFIG}); make one with --run-dir")
    config = _read_object(path / CONFIG, key="settings")
    summary = _read_object(path / SUMMARY) if (path / SUMMARY).is_file() else {}
    if not (path / METRICS).is_file():
        raise ValueError(f"{path / METRICS}: missing: the run recorded no metrics, so there is nothing to plot")
    metrics = list(read_events(path / METRICS))
    events = list(read_events(path / EVENTS))
    for sub in sorted(path.glob("sync-*/" + EVENTS)):  # the runtime's shards keep their own logs
        events.extend(read_events(sub))
    events.sort(key=lambda e: e.get("t", 0.0))
    return RunRecord(path, config, summary, metrics, events)
