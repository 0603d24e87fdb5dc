"""Write-ahead for global versions: an update leaves only once its version is on disk.

With --checkpoint-every 1 (the default) a learner can never hold a version that a crash of the
synchronizer would lose, so a restarted synchronizer never has to drag anyone back. The cost of a
durable write (two fsyncs, tens of milliseconds on a plain disk) is kept off the service lock and
shared: a background thread writes the latest state whenever asked, so merges that happen during a
write are committed together by the next one (group commit). Updates wait in `held` until then.
A write that fails, whatever the error, is logged and retried with backoff (`records.supervise`): a
writer thread that died would hold every update from then on while the process looked healthy.

With --checkpoint-every N > 1 updates are not held: a crash may lose up to N merges, and learners
that saw them are moved back to the restored versions when they reconnect (see `client`).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

from ..records.supervise import Supervisor, run_supervised
from .checkpoint import CheckpointStore, Snapshot

log = logging.getLogger(__name__)


class CommitLog:
    def __init__(
        self,
        store: CheckpointStore,
        cond: threading.Condition,
        snapshot: Callable[[], Snapshot],
        committed: dict[int, int],
        hold: bool,
        on_written: Callable[[Snapshot], None] = lambda snap: None,
    ) -> None:
        """`cond` is the service's condition (its lock guards the core); `snapshot` runs under it."""
        self.store = store
        self.cond = cond
        self.snapshot = snapshot
        self.committed = dict(committed)
        self.hold = hold
        self.on_written = on_written
        self.held: list[tuple[int, int, Callable[[], None]]] = []
        self._wanted = 0
        self._done = 0
        self._closed = False
        self._supervisor = Supervisor("checkpoint writer (updates stay held until a write succeeds)", log)
        self._thread = threading.Thread(target=self._run, name="ddiloco-commit", daemon=True)
        self._thread.start()

    def request(self) -> None:
        """Ask for a checkpoint of the current state (caller holds the lock)."""
        self._wanted += 1
        self.cond.notify_all()

    def deliver(self, fragment: int, version: int, send: Callable[[], None]) -> None:
        """Run `send` now if `version` is durable (or nothing is held), else once it is (caller holds the lock)."""
        if not self.hold or version <= self.committed.get(fragment, -1):
            send()
        else:
            self.held.append((fragment, version, send))

    def _run(self) -> None:
        run_supervised(self._step, self._pause, self._supervisor)

    def _step(self) -> bool:
        """Write the latest state once one is wanted and release what it made durable; False once closed.

        Any failure (a full disk's OSError, safetensors' SafetensorError at the open-file limit, a bug)
        raises out to `run_supervised`: `_done` has not moved, so the updates stay held and the write
        is retried after a backoff until one succeeds."""
        with self.cond:
            self.cond.wait_for(lambda: self._wanted > self._done or self._closed)
            if self._wanted <= self._done:
                return False
            ticket = self._wanted
            snap = self.snapshot()
        started = time.perf_counter()
        self.store.write(snap)
        snap.write_seconds = time.perf_counter() - started
        with self.cond:
            self._done = max(self._done, ticket)
            self.committed.update(snap.versions)
            ready = [h for h in self.held if h[1] <= self.committed.get(h[0], -1)]
            self.held = [h for h in self.held if h[1] > self.committed.get(h[0], -1)]
            errors = []
            for _, _, send in ready:  # one learner's failed send must not keep the others' updates
                try:
                    send()
                except Exception as exc:  # noqa: BLE001 - re-raised below, after every send was tried
                    errors.append(exc)
            self.cond.notify_all()
            self.on_written(snap)
        if errors:
            raise errors[0]
        return True

    def _pause(self, seconds: float) -> bool:
        """Wait before retrying a failed write; False (stop) once closing: `close`'s caller writes the final
        checkpoint itself."""
        with self.cond:
            return not self.cond.wait_for(lambda: self._closed, seconds)

    def close(self) -> None:
        """Finish the write in progress and any requested one, then stop."""
        with self.cond:
            self._closed = True
            self.cond.notify_all()
        self._thread.join(timeout=30)
