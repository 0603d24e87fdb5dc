"""Range checks for every value a client sends, where it enters the synchronizer.

A request whose fields fall outside these bounds is refused with the field named, counted and
logged, and changes nothing. The bounds are generous for any real run and tight enough that no
value can overflow a float, a sum or a log line downstream: counters stay below 2**53 (exact in a
float64), durations below 10**7 s, wall-clock stamps within the years 1970 to 2286, texts short.
"""

from __future__ import annotations

import math
from collections.abc import Collection

from ..wire.digest import is_digest

MAX_COUNT = 2**53  # tokens, steps, data positions, versions
MAX_SECONDS = 1e7  # durations: a step, the time a contribution took
MAX_WALL = 1e10  # wall-clock stamps (seconds since the epoch)
MAX_ID_CHARS = 64  # session ids, incarnations
MAX_REASON_CHARS = 200
MAX_STATE_CHARS = 32
MAX_LEARNER_ID = 2**31 - 1  # the service's --max-learners bounds ids further
MAX_OVERLAP = 100_000  # a tau in steps (a contribution's is checked against its run's H instead)
MAX_LINK_SECONDS = 3600.0  # a learner's measured link time (snapshot to update back)
# A learner's smoothed step time. It feeds the grace window and the final flush's gathering window
# (H steps' worth each), so one learner reporting 1e7 s would stretch them for months (#46).
MAX_STEP_SECONDS = 3600.0


class BadField(ValueError):
    """A field out of its range; the message names the field."""


def count(head: dict, key: str, *, low: int = 0, high: int = MAX_COUNT, default: int | None = None) -> int:
    """An integer in [low, high]; `default` (when given) stands in for a missing field."""
    if key not in head and default is not None:
        return default
    value = head.get(key)
    if not isinstance(value, int) or isinstance(value, bool):
        raise BadField(f"field {key!r} must be an integer, got {show(value)}")
    if not low <= value <= high:
        raise BadField(f"field {key!r} must be in [{low}, {high}], got {show(value)}")
    return value


def flag(head: dict, key: str) -> bool:
    """A true/false field; a missing one is false."""
    value = head.get(key, False)
    if not isinstance(value, bool):
        raise BadField(f"field {key!r} must be true or false, got {show(value)}")
    return value


def optional_count(head: dict, key: str) -> int | None:
    return None if head.get(key) is None else count(head, key)


def number(head: dict, key: str, *, low: float = 0.0, high: float = MAX_SECONDS, default: float | None = None) -> float:
    """A finite number in [low, high]; `default` (when given) stands in for a missing field."""
    if key not in head and default is not None:
        return default
    value = head.get(key)
    if not isinstance(value, (int, float)) or isinstance(value, bool):
        raise BadField(f"field {key!r} must be a number, got {show(value)}")
    try:
        value = float(value)
    except OverflowError:
        raise BadField(f"field {key!r} is out of range") from None
    if not (math.isfinite(value) and low <= value <= high):
        raise BadField(f"field {key!r} must be a finite number in [{low:g}, {high:g}], got {show(value)}")
    return value


def wall_time(head: dict, key: str, default: float) -> float:
    return number(head, key, low=0.0, high=MAX_WALL, default=default)


def text(head: dict, key: str, limit: int, default: str | None = None) -> str:
    """A string of at most `limit` characters."""
    if key not in head and default is not None:
        return default
    value = head.get(key)
    if not isinstance(value, str):
        raise BadField(f"field {key!r} must be a string, got {show(value)}")
    if len(value) > limit:
        raise BadField(f"field {key!r} is {len(value)} characters long, the limit is {limit}")
    return value


def reason(head: dict, default: str = "") -> str:
    """A free-text reason, cut to MAX_REASON_CHARS (it only ever reaches logs)."""
    value = head.get("reason", default)
    if not isinstance(value, str):
        raise BadField(f"field 'reason' must be a string, got {show(value)}")
    return value[:MAX_REASON_CHARS]


def progress(head: dict) -> dict:
    """The progress fields of a heartbeat, checked; absent fields stay absent."""
    out: dict = {}
    for key in ("step", "tokens", "position"):
        if head.get(key) is not None:
            out[key] = count(head, key)
    if head.get("step_time") is not None:
        out["step_time"] = number(head, "step_time", high=MAX_STEP_SECONDS)
    if head.get("loss") is not None:
        out["loss"] = number(head, "loss", high=1e6)
    if head.get("overlap") is not None:  # the learner's tau (`learner.overlap`)
        out["overlap"] = count(head, "overlap", high=MAX_OVERLAP)
    if head.get("link_seconds") is not None:
        out["link_seconds"] = number(head, "link_seconds", high=MAX_LINK_SECONDS)
    if head.get("state") is not None:
        out["state"] = text(head, "state", MAX_STATE_CHARS)
    return out


def digests(head: dict, key: str, names: Collection[str]) -> dict[str, str]:
    """Digests of tensor values by name (`wire.digest`), names from the model; absent: none."""
    value = head.get(key)
    if value is None:
        return {}
    if not isinstance(value, dict) or len(value) > len(names):
        raise BadField(f"field {key!r} must map at most {len(names)} tensor names to digests")
    for name, d in value.items():
        if name not in names or not is_digest(d):
            raise BadField(f"field {key!r}: {show(name)} is not a tensor of the model or {show(d)} is not a digest")
    return value


def show(value: object) -> str:
    """A value for an error message, never long: a client chooses it."""
    if isinstance(value, int) and not isinstance(value, bool) and abs(value) > 10**18:
        return f"an integer of {value.bit_length()} bits"
    shown = repr(value)
    return shown if len(shown) <= 40 else shown[:37] + "..."
