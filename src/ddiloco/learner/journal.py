"""A learner process's own record of the work it trained, readable after a kill -9.

One small file per process (incarnation), rewritten in place at every step with a single pwrite of
a fixed-size JSON record: no fsync (a killed process's writes are already in the page cache), a few
microseconds per step. The launcher sums these files to know how many tokens were trained, including
the steps a learner took after its last heartbeat before it was killed.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path

RECORD_BYTES = 1024  # room for a version per fragment and the token counts by cause


class Journal:
    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)

    def write(self, record: dict) -> None:
        if self._fd < 0:
            return
        data = json.dumps(record, separators=(",", ":")).encode()
        if len(data) > RECORD_BYTES:
            raise ValueError("journal record too large")
        os.pwrite(self._fd, data.ljust(RECORD_BYTES), 0)

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1


def read_journals(directory: str | Path, pattern: str = "**/journal-*.json") -> Iterator[dict]:
    for path in sorted(Path(directory).glob(pattern)):
        try:
            yield json.loads(path.read_bytes().strip() or b"{}")
        except (OSError, json.JSONDecodeError):
            continue
