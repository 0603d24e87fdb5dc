"""Range checks for the numbers and texts a peer sends in a message head, where they enter.

A field outside its bounds raises `BadField`, which names the field. The bounds are generous for any
real run and tight enough that no value can overflow a float, a sum or a log line downstream:
counters stay below 2**53 (exact in a float64), durations below 10**7 s, wall-clock stamps within
the years 1970 to 2286, texts short. The synchronizer checks every number a client sends with these
(`headers` for a contribution, `synchronizer.intake` for the other requests).
"""

from __future__ import annotations

import math
from collections.abc import Mapping

MAX_COUNT = 2**53  # tokens, steps, data positions, versions
MAX_SECONDS = 1e7  # durations: a step, the time a contribution took
MAX_WALL = 1e10  # wall-clock stamps (seconds since the epoch)
MAX_LINK_SECONDS = 3600.0  # a learner's measured link time (snapshot to update back)
# A learner's smoothed step time. It feeds the grace window and the final flush's gathering window
# (H steps' worth each), so one learner reporting 1e7 s would stretch them for months (#46).
MAX_STEP_SECONDS = 3600.0

Head = Mapping[str, object]


class BadField(ValueError):
    """A field out of its range; the message names the field."""


def count(head: Head, key: str, *, low: int = 0, high: int = MAX_COUNT, default: int | None = None) -> int:
    """An integer in [low, high]; `default` (when given) stands in for a missing field."""
    if key not in head and default is not None:
        return default
    value = head.get(key)
    if not isinstance(value, int) or isinstance(value, bool):
        raise BadField(f"field {key!r} must be an integer, got {show(value)}")
    if not low <= value <= high:
        raise BadField(f"field {key!r} must be in [{low}, {high}], got {show(value)}")
    return value


def flag(head: Head, key: str) -> bool:
    """A true/false field; a missing one is false."""
    value = head.get(key, False)
    if not isinstance(value, bool):
        raise BadField(f"field {key!r} must be true or false, got {show(value)}")
    return value


def optional_count(head: Head, key: str) -> int | None:
    return None if head.get(key) is None else count(head, key)


def number(head: Head, key: str, *, low: float = 0.0, high: float = MAX_SECONDS, default: float | None = None) -> float:
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


def wall_time(head: Head, key: str, default: float) -> float:
    return number(head, key, low=0.0, high=MAX_WALL, default=default)


def text(head: Head, key: str, limit: int, default: str | None = None) -> str:
    """A string of at most `limit` characters."""
    if key not in head and default is not None:
        return default
    value = head.get(key)
    if not isinstance(value, str):
        raise BadField(f"field {key!r} must be a string, got {show(value)}")
    if len(value) > limit:
        raise BadField(f"field {key!r} is {len(value)} characters long, the limit is {limit}")
    return value


def show(value: object) -> str:
    """A value for an error message, never long: a client chooses it."""
    if isinstance(value, int) and not isinstance(value, bool) and abs(value) > 10**18:
        return f"an integer of {value.bit_length()} bits"
    shown = repr(value)
    return shown if len(shown) <= 40 else shown[:37] + "..."
