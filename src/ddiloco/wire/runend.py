"""The mark a synchronizer shard leaves when its run is over: a small JSON file beside its address
file (`ADDRESS.finished`), written atomically as the shard exits 0 and removed when a shard starts.

Why a file: once a finished shard has exited, its port is closed, and a learner that was cut off
across the end of the run (or a learner job started late) cannot tell a finished run from a crashed
synchronizer by the closed port alone. The mark says the run is over and, per learner, how far its
work was counted (`merged_position`, the data position the books reached), so that learner can end
at once: 0 if all its work was counted, non-zero if it trained past that (`learner.ending`).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path

SUFFIX = ".finished"
MAX_BYTES = 4 << 20  # a book line per learner: 4096 learners fit many times over


def marker_path(address_file: str | Path) -> Path:
    """Where the shard whose address file is `address_file` marks its run finished."""
    return Path(f"{address_file}{SUFFIX}")


def encode(status: Mapping[str, object]) -> bytes:
    """The mark from a shard's final status (`synchronizer.status`): who was counted how far."""
    books = status.get("books")
    rows = books.items() if isinstance(books, Mapping) else ()
    return json.dumps(
        {
            "finished": True,
            "shard": status.get("shard"),
            "tokens_merged": status.get("tokens_merged"),
            "books": {
                str(m): {"merged_position": b.get("merged_position", 0), "tokens_merged": b.get("tokens_merged", 0.0)}
                for m, b in rows
                if isinstance(b, Mapping)
            },
        },
        sort_keys=True,
    ).encode()


def read(address_file: str | Path) -> dict[str, object] | None:
    """The mark beside `address_file`, or None: missing, too large, or not a finished mark."""
    try:
        with open(marker_path(address_file), "rb") as f:
            data = f.read(MAX_BYTES + 1)
    except OSError:
        return None
    if len(data) > MAX_BYTES:
        return None
    try:
        mark = json.loads(data)
    except (UnicodeDecodeError, ValueError):
        return None
    if not isinstance(mark, dict) or mark.get("finished") is not True or not isinstance(mark.get("books"), dict):
        return None
    return mark


def counted_position(mark: Mapping[str, object], learner: int) -> int:
    """How far the shard's books counted `learner`'s data stream (0: none of its work)."""
    books = mark.get("books")
    book = books.get(str(learner)) if isinstance(books, Mapping) else None
    value = book.get("merged_position") if isinstance(book, Mapping) else None
    return value if isinstance(value, int) and not isinstance(value, bool) else 0
