"""Range checks for every value a client sends, where it enters the synchronizer.

A request whose fields fall outside these bounds is refused with the field named, counted and
logged, and changes nothing. The bounds are generous for any real run and tight enough that no
value can overflow a float, a sum or a log line downstream. The checks of single fields live in
`wire.fields` (the handlers take them from here), beside a contribution's header, which its own
decoder checks (`wire.headers.ContributionHeader.decode`).
"""

from __future__ import annotations

from collections.abc import Collection

from ..wire.digest import is_digest
from ..wire.fields import MAX_LINK_SECONDS, MAX_STEP_SECONDS
from ..wire.fields import BadField as BadField
from ..wire.fields import count as count
from ..wire.fields import flag as flag
from ..wire.fields import number as number
from ..wire.fields import optional_count as optional_count
from ..wire.fields import show as show
from ..wire.fields import text as text

MAX_ID_CHARS = 64  # session ids, incarnations
MAX_REASON_CHARS = 200
MAX_STATE_CHARS = 32
MAX_LEARNER_ID = 2**31 - 1  # the service's --max-learners bounds ids further
MAX_OVERLAP = 100_000  # a tau in steps (a contribution's is checked against its run's H instead)


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
