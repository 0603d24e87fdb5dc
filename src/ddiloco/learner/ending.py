"""How a learner ends without its synchronizer: the bound on the work it does alone, a run it finds
finished, and the exit code that tells a scheduler not to start it again.

A learner cut off from a shard (no answer from it for longer than the failure timeout, after which
the shard declares it gone) trains on: a partition may heal, and work that comes back within the
staleness bound is still merged. While another shard answers, its work on that shard's fragments is
merged too, so it never stops training for one lost shard (the others would stall). Cut off from
every shard, past S rounds' worth of steps alone (S x H) its work would be refused (more than S
versions late), so it stops training there and only waits for its synchronizer; `orphan_timeout`
seconds after any shard's last answer it ends with EXIT_ORPHANED. It waits rather
than ends at S x H because a synchronizer restarted from its checkpoint (a crash, a requeued job) is
back within seconds, when S x H steps of a small model take less than one: the learner then resyncs
and trains on. Without these bounds a learner cut off across the end of a run would train alone until
someone killed it.

A learner that finds the run finished (the shard's mark beside its address file, `wire.runend`, or
a registration reply that says so) ends at once: 0 when the shard's books count its work up to its
data position, EXIT_ORPHANED when it trained past what was counted.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from ..records.atomic import atomic_write
from ..wire import runend

EXIT_ORPHANED = 3  # ended without its synchronizer; its work is on disk; do not restart it for this run
DEFAULT_ORPHAN_TIMEOUT = 600.0  # seconds a learner trains on alone at most (`--orphan-timeout`)


class RunFinished(ConnectionError):
    """A shard's run is over (its mark, or its reply): there is nothing left to register with."""

    def __init__(self, message: str, mark: Mapping[str, object]) -> None:
        super().__init__(message)
        self.mark = dict(mark)


@dataclass(frozen=True)
class Ending:
    """Why a learner stopped on its own, and the exit code it should end with."""

    reason: str
    code: int

    def as_dict(self) -> dict:
        return {"ended": self.reason, "exit_code": self.code}


MARK = "ended.json"  # in the state dir: this learner ended without its synchronizer (code 3)


def mark_ended(state_dir: Path, ending: Ending) -> None:
    """Leave the ending beside the journal: a scheduler's restart of this learner reads it (`restarted_after`)."""
    atomic_write(state_dir / MARK, json.dumps({**ending.as_dict(), "wall": time.time()}).encode())


def clear_mark(state_dir: Path) -> None:
    """A learner that joined its run again is no longer ended."""
    (state_dir / MARK).unlink(missing_ok=True)


def restarted_after(state_dir: Path | None) -> Ending | None:
    """A torchrun restart of a group whose learner ended without its synchronizer (exit 3 is a failure
    to torchrun, which starts the group again up to --max-restarts times): it ends at once, 0."""
    if state_dir is None or os.environ.get("TORCHELASTIC_RESTART_COUNT", "0") in ("", "0"):
        return None
    if not (state_dir / MARK).is_file():
        return None
    return Ending(f"ended before without its synchronizer ({state_dir / MARK}); not started again by torchrun", 0)


def kept_in(where: str | None) -> str:
    return f"its journal and inner state are kept in {where}" if where else "it has no --state-dir to keep them in"


class EndWatch:
    """Rank 0's judge, asked at every step boundary (and while a blocking sync waits)."""

    def __init__(self, learner: int, orphan_timeout: float, solo_steps: int, failure: float, where: str | None):
        """`solo_steps`: S x H, the steps whose work can still be merged after the last answer."""
        self.learner = learner
        self.orphan_timeout = orphan_timeout
        self.solo_steps = solo_steps
        self.failure = failure
        self.where = where
        self.contact_step = 0  # the learner's step at the last boundary with every shard answering
        self.heard_step = 0  # ... and with some shard answering (`idle` counts the steps alone from it)
        self.finished: dict[int, dict] = {}  # shard -> its mark (or what its reply said)
        self.gave_up: dict[int, str] = {}  # shard -> why its link stopped registering (the orphan bound)
        self.ending: Ending | None = None

    def lost(self, contact: float, now: float) -> bool:
        """No answer from some shard for longer than the failure timeout (`contact`: the oldest last answer)."""
        return now - contact > self.failure

    def check(
        self, step: int, position: int, contact: float, address: str, newest: float | None = None
    ) -> Ending | None:
        """The ending, once there is one: a finished run, or the orphan timeout passed. `contact`: the
        oldest of the shards' last answers (`address` its shard's); `newest`: the newest (default `contact`)."""
        if not self.lost(contact if newest is None else newest, time.monotonic()):
            self.heard_step = step
        if self.ending is not None:
            return self.ending
        if self.finished:
            self.ending = self._finished(position)
            return self.ending
        now = time.monotonic()
        if not self.lost(contact, now) and not self.gave_up:
            self.contact_step = step
            return None
        alone = now - contact
        if alone < self.orphan_timeout and not self.gave_up:
            return None
        since = time.strftime("%H:%M:%S", time.localtime(time.time() - alone))
        self.ending = Ending(
            f"learner {self.learner}: lost its synchronizer {address} at {since} for {alone:.0f} s "
            f"(orphan timeout {self.orphan_timeout:g} s), after {step - self.contact_step} steps alone "
            f"(at most S x H = {self.solo_steps}); {kept_in(self.where)}",
            EXIT_ORPHANED,
        )
        return self.ending

    def idle(self, step: int, newest: float) -> bool:
        """S x H steps with no shard answering (`newest`: the newest of their last answers): more would
        be refused as stale, so the learner waits without training (`check` still ends it at the
        orphan timeout)."""
        return self.lost(newest, time.monotonic()) and step - self.heard_step >= self.solo_steps

    def _finished(self, position: int) -> Ending:
        counted = min(runend.counted_position(mark, self.learner) for mark in self.finished.values())
        shards = ", ".join(str(s) for s in sorted(self.finished))
        head = f"learner {self.learner}: the run is finished (shard {shards})"
        if counted >= position:
            return Ending(f"{head}; its work up to data position {position} was counted", 0)
        return Ending(
            f"{head}; its work past data position {counted} (to {position}) was not merged; {kept_in(self.where)}",
            EXIT_ORPHANED,
        )
