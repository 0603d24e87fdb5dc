"""What a set of runs is about, for the people who read its report: the scenario in one sentence, the
headline computed from the numbers, and the moment the headline refers to (marked on the loss-against-time
plot). `ddiloco demo` writes it beside its runs (`story.json`), so `ddiloco report` of that folder tells
the same story; runs without one get a report without it. Also the human names of the methods."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Sequence
from pathlib import Path

from ..records.atomic import atomic_write_json
from ..records.rundir import RunRecord

STORY = "story.json"
METHOD_NAMES = {
    "decoupled": "Decoupled DiLoCo",
    "diloco": "DiLoCo",
    "streaming": "Streaming DiLoCo",
    "ddp": "DDP",
    "elastic-ddp": "elastic DDP",
}


@dataclasses.dataclass(frozen=True)
class Story:
    scenario: str
    headline: str
    moment: float | None = None  # seconds since the start: the time the headline compares the runs at
    moment_label: str = ""

    def save(self, folder: Path) -> Path:
        path = folder / STORY
        atomic_write_json(path, dataclasses.asdict(self), durable=False)
        return path


def load_story(folder: Path) -> Story | None:
    """The story written beside a folder's runs, or None (absent or not one)."""
    path = folder / STORY
    try:
        raw = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    if (
        not isinstance(raw, dict)
        or not isinstance(raw.get("scenario"), str)
        or not isinstance(raw.get("headline"), str)
    ):
        return None
    moment = raw.get("moment")
    return Story(
        raw["scenario"],
        raw["headline"],
        float(moment) if isinstance(moment, (int, float)) else None,
        str(raw.get("moment_label", "")),
    )


def method_of(record: RunRecord) -> str:
    settings = record.config.get("settings", {})
    return str(settings.get("method", "?")) if isinstance(settings, dict) else "?"


def labels(records: Sequence[RunRecord]) -> list[str]:
    """One readable name per run: the method's name, and the run's folder only where two runs share a
    method."""
    methods = [method_of(r) for r in records]
    return [
        METHOD_NAMES.get(m, m) + (f" ({r.path.name})" if methods.count(m) > 1 else "")
        for m, r in zip(methods, records, strict=True)
    ]
