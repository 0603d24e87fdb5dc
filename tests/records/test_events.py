"""One event-log schema: {"t", "kind", ...fields} for the simulator and the runtime alike."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import torch

import ddiloco
from ddiloco.records.events import KINDS, EventLog, read_events

SOURCE = Path(ddiloco.__file__).parent


def test_records_carry_time_kind_and_plain_fields(tmp_path):
    path = tmp_path / "events.jsonl"
    with EventLog(path, clock=lambda: 12.5) as log:
        log.write(
            "merge",
            fragment=1,
            version=3,
            learners=[0, 2],
            expected=3,
            quorum_seconds=0.25,
            grace_seconds=0.1,
            params={"w": torch.zeros(2)},
            where=tmp_path,
        )
        log.observe("down", 3.5, {"learner": 1})
    first, second = list(read_events(path))
    assert first == {
        "t": 12.5,
        "kind": "merge",
        "fragment": 1,
        "version": 3,
        "learners": [0, 2],
        "expected": 3,
        "quorum_seconds": 0.25,
        "grace_seconds": 0.1,
        "where": str(tmp_path),
    }  # tensors left out
    assert second == {"t": 3.5, "kind": "down", "learner": 1}


def test_an_unknown_kind_is_a_bug():
    with pytest.raises(ValueError, match="unknown event kind"):
        EventLog(None).write("merged")


def test_a_torn_last_line_is_skipped(tmp_path):
    path = tmp_path / "events.jsonl"
    with EventLog(path) as log:
        log.write("stop", reason="done")
    with open(path, "a") as f:
        f.write('{"t": 1.0, "kind": "mer')
    assert [e["kind"] for e in read_events(path)] == ["stop"]


def test_append_keeps_and_truncate_replaces(tmp_path):
    path = tmp_path / "events.jsonl"
    for append in (True, True, False):
        with EventLog(path, append=append) as log:
            log.write("stop", reason="x")
    assert len(list(read_events(path))) == 1


def test_every_kind_the_code_writes_is_in_the_schema():
    """Both drivers (sim: observe(kind, ...), runtime: events.write(kind, ...)) speak KINDS only."""
    written = set()
    for path in SOURCE.rglob("*.py"):
        text = path.read_text()
        written |= set(re.findall(r'events\.write\(\s*"(\w+)"', text))
        written |= set(re.findall(r'self\.observe\(\s*"(\w+)"', text))
    assert written, "found no event writes: the pattern above is out of date"
    assert written <= set(KINDS), f"kinds missing from KINDS: {sorted(written - set(KINDS))}"
    assert {"merge", "join", "rejected"} <= written  # the kinds both drivers share
    json.dumps(KINDS)
