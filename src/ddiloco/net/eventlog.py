"""An append-only event log, one JSON object per line, each stamped with wall time `t`.

Every process of a run writes its own log (no cross-process locking); lines are flushed as they are
written so that a process killed with SIGKILL loses at most the line it was writing.
"""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path
from typing import Iterator


class EventLog:
    def __init__(self, path: str | Path | None) -> None:
        self.path = Path(path) if path is not None else None
        self._lock = threading.Lock()
        self._file = None
        if self.path is not None:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._file = open(self.path, "a", buffering=1)

    def write(self, kind: str, **fields: object) -> None:
        if self._file is None:
            return
        line = json.dumps({"t": time.time(), "kind": kind, **fields}, default=str, separators=(",", ":"))
        with self._lock:
            if self._file is not None:
                self._file.write(line + "\n")

    def close(self) -> None:
        with self._lock:
            if self._file is not None:
                self._file.close()
                self._file = None


def read_events(path: str | Path) -> Iterator[dict]:
    """The events of a log; a torn last line (the writer was killed) is skipped."""
    path = Path(path)
    if not path.is_file():
        return
    with open(path) as f:
        for line in f:
            try:
                yield json.loads(line)
            except json.JSONDecodeError:
                continue
