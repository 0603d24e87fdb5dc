"""The event log: one JSON object per line, one schema for the simulator and the runtime.

Every record is `{"t": seconds, "kind": name, ...fields}`. In the runtime `t` is wall-clock time
(seconds since the epoch); in `ddiloco sim` it is virtual time (seconds since the run started). The
same event has the same kind and field names in both, so one reader (`read_events`) and one set of
tools serve both. `KINDS` lists every kind with what it means; writing any other kind is a bug and
raises. Values that are not JSON (tensors, say) are left out; paths and enums are written as text.

Every process of a run writes its own log (no cross-process locking); lines are flushed as they are
written so that a process killed with SIGKILL loses at most the line it was writing.
"""

from __future__ import annotations

import enum
import json
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TextIO

KINDS: dict[str, str] = {
    # the algorithm (both drivers)
    "merge": "an outer step: fragment, version (new), learners (admitted), expected, quorum_seconds, "
    "grace_seconds; the runtime adds admitted (the work of each, with tokens and data positions)",
    "join": "a learner (re)joined: learner, versions it starts from",
    "rejected": "a contribution refused by the synchronizer: learner, fragment, code (`RejectCode`), reason",
    "down": "a learner stopped (failure or kill): learner",
    "up": "a learner started again and begins to join: learner",
    "generation": "data-parallel: the workers that all-reduce together changed: members (learner ids; empty "
    "while the job stalls), reason",
    # the synchronizer service
    "started": "a synchronizer shard started: shard, num_shards, versions",
    "restored": "a shard restored its checkpoint: seq, versions",
    "checkpoint": "a checkpoint is durable: seq, versions, write_seconds (its fragment files and manifest)",
    "sent": "a merged fragment was queued for every live learner: fragment, version, round_seconds (from "
    "its round closing: merge, outer step, encoding and the write-ahead checkpoint), merged_seconds "
    "(the same without the checkpoint)",
    "leave": "a learner left or was declared gone: learner, incarnation, reason",
    "replaced": "a learner id registered again and its old session was closed: learner, incarnation, previous",
    "no_quorum": "a round waited a failure timeout without a quorum: fragment, version, reason",
    "refused": "a request refused at the wire (bad frame, size, auth): method, reason",
    "stop": "the run is stopping: reason",
    "final_flush": "the learners ended the run themselves (no budget, no Stop): began (true: every live learner "
    "finished its loop, the final flush begins; false: a learner joined, the run goes on), reason",
    "closed": "a shard closed: versions",
    # the launcher
    "run_started": "ddiloco run began: config, chaos",
    "run_finished": "ddiloco run ended: error, learner_restarts",
    "synchronizer_started": "a shard process started: shard, pid, port",
    "synchronizer_exited": "a shard process exited: shard, pid, code",
    "learner_started": "a learner process started: learner, pid, restarts",
    "learner_exited": "a learner process exited: learner, pid, code",
    "learner_terminated": "a learner process was ended at the run's end: learner, pid",
    "chaos_kill_learner": "chaos: kill -9 of a learner: learner, pid",
    "chaos_kill_synchronizer": "chaos: kill -9 of a shard: shard, pid",
    "chaos_sigstop": "chaos: a learner frozen with SIGSTOP: learner, seconds",
    "chaos_sigcont": "chaos: a frozen learner resumed: learner",
}


def _text(value: object) -> str:
    if isinstance(value, (Path, enum.Enum)):
        return str(value.value if isinstance(value, enum.Enum) else value)
    raise TypeError(f"{type(value).__name__} is not JSON")


def _encode(value: object) -> str | None:
    """The value as JSON, or None when it is not JSON (a tensor, a module): such fields are left out."""
    try:
        return json.dumps(value, default=_text, separators=(",", ":"))
    except (TypeError, ValueError):
        return None


class EventLog:
    """Appends to `path` (None: writes nothing). `clock` stamps records written without `t`."""

    def __init__(self, path: str | Path | None, clock: Callable[[], float] = time.time, append: bool = True) -> None:
        self.path = Path(path) if path is not None else None
        self.clock = clock
        self._lock = threading.Lock()
        self._file: TextIO | None = None
        if self.path is not None:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._file = open(self.path, "a" if append else "w", buffering=1)

    def write(self, kind: str, t: float | None = None, **fields: object) -> None:
        if kind not in KINDS:
            raise ValueError(f"unknown event kind {kind!r}: add it to ddiloco.records.events.KINDS")
        if self._file is None:
            return
        stamp = self.clock() if t is None else t
        parts = [f'"t":{round(stamp, 6)!r}', f'"kind":{json.dumps(kind)}']
        for key, value in fields.items():
            encoded = _encode(value)
            if encoded is not None and key not in ("t", "kind"):
                parts.append(f"{json.dumps(key)}:{encoded}")
        line = "{" + ",".join(parts) + "}\n"
        with self._lock:
            if self._file is not None:
                self._file.write(line)

    def observe(self, kind: str, time: float, details: dict) -> None:
        """The simulator's observer signature: `observer(kind, time, details)`."""
        self.write(kind, t=time, **details)

    def close(self) -> None:
        with self._lock:
            if self._file is not None:
                self._file.close()
                self._file = None

    def __enter__(self) -> EventLog:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def read_events(path: str | Path) -> Iterator[dict]:
    """The events of a log; a torn last line (the writer was killed) is skipped, and so is a line
    that is not a JSON object. ValueError, naming the file, when it is not text at all."""
    path = Path(path)
    if not path.is_file():
        return
    with open(path) as f:
        try:
            for line in f:
                try:
                    record = json.loads(line)
                except json.JSONDecodeError:
                    continue
                if isinstance(record, dict):
                    yield record
        except UnicodeDecodeError as exc:
            raise ValueError(f"{path}: not a JSON-lines log ({exc.reason} at byte {exc.start})") from None
