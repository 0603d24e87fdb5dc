"""The launcher's loop: start the synchronizer shards and the learners, keep them running, inject
faults, watch the run, stop it, and leave every process ended.

It polls every `TICK` seconds: carries out due chaos events, restarts learners that died (after
--learner-down seconds) and synchronizer shards that died, asks each shard for its status (for the
live view and to notice the stop), and writes what it does to events.jsonl. The stop itself is
decided by the synchronizer (token budget or duration): learners then flush their last work, leave
and exit, the shards drain and exit, and the launcher only ends (by PID) what is still running after
a bounded wait.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import cast

import grpc

from ..chaos.injector import ChaosEvent, ChaosInjector
from ..records.events import EventLog
from ..wire import framing, rpc
from ..wire.timeouts import Timeouts
from .config import RunConfig
from .procs import Child, ProcessTable, ddiloco_command

log = logging.getLogger(__name__)
TICK = 0.1
STATUS_EVERY = 0.5

MAX_CRASHES = 3  # a learner that crashes this many times in a row, each within CRASH_WINDOW of starting,
CRASH_WINDOW = 60.0  # ends the run with an error instead of being restarted forever


@dataclass
class LearnerSlot:
    id: int
    child: Child | None = None
    state: str = "starting"  # starting | running | down | straggling | done | failed
    restarts: int = 0
    restart_at: float | None = None
    held_until_trace: bool = False
    started_at: float = 0.0
    crashes: int = 0  # exits with an error in a row, each soon after its start


@dataclass
class ShardSlot:
    index: int
    child: Child | None = None
    port: int = 0
    address: str | None = None
    restart_at: float | None = None
    restarts: int = 0
    status: dict = field(default_factory=dict)
    stubs: rpc.Stubs | None = None
    state: str = "running"  # running | down | done
    chaos_killed: bool = False


class Supervisor:
    def __init__(self, config: RunConfig, on_tick: Callable[[Supervisor], None] | None = None) -> None:
        self.config = config
        self.on_tick = on_tick or (lambda s: None)
        config.run_dir.mkdir(parents=True, exist_ok=True)
        env = dict(os.environ)
        if config.token:
            env["DDILOCO_TOKEN"] = config.token
        self.procs = ProcessTable(env)
        self.events = EventLog(config.run_dir / "events.jsonl")
        self.timeouts = Timeouts.derive(config.heartbeat)
        self.injector = ChaosInjector(config.chaos, config.learners, config.horizon)
        if self.injector.trace.outages:
            self.injector.trace.save(config.run_dir / "chaos-trace.csv")
        self.learners = [LearnerSlot(m) for m in range(config.learners)]
        self.shards = [ShardSlot(s) for s in range(config.sync_shards)]
        self.t0 = time.monotonic()
        self.start_wall = time.time()
        self.stopping = False
        self.stop_wall: float | None = None
        self.interrupted = threading.Event()
        self.straggling: dict[int, float] = {}
        self.learner_restarts = 0
        self.error: str | None = None
        self._terminated_learners = False

    def elapsed(self) -> float:
        return time.monotonic() - self.t0

    # --- processes ------------------------------------------------------------------------------
    def _start_shard(self, shard: ShardSlot) -> None:
        d = self.config.sync_dir(shard.index)
        d.mkdir(parents=True, exist_ok=True)
        (d / "address").unlink(missing_ok=True)
        cmd = ddiloco_command(*self.config.synchronizer_args(shard.index, shard.port))
        shard.child = self.procs.start(f"sync-{shard.index}", cmd, d / "stderr.log", d / "stdout.log")
        shard.state = "running"
        self.events.write("synchronizer_started", shard=shard.index, pid=shard.child.pid, port=shard.port)

    def _wait_address(self, shard: ShardSlot, timeout: float = 120.0) -> None:
        path = self.config.sync_dir(shard.index) / "address"
        deadline = time.monotonic() + timeout
        while not path.is_file():
            if shard.child is not None and not shard.child.alive():
                raise RuntimeError(
                    f"synchronizer shard {shard.index} exited with code {shard.child.poll()}; "
                    f"see {self.config.sync_dir(shard.index) / 'stderr.log'}"
                )
            if time.monotonic() > deadline or self.interrupted.is_set():
                raise RuntimeError(f"synchronizer shard {shard.index} did not start within {timeout:g} s")
            time.sleep(0.05)
        shard.address = path.read_text().strip()
        shard.port = int(shard.address.rsplit(":", 1)[1])
        if shard.stubs is None:
            channel = rpc.open_channel(shard.address, "control", framing.DEFAULT_CHUNK_BYTES + rpc.FRAME_MARGIN)
            shard.stubs = rpc.Stubs(channel, self.config.token)

    def _start_learner(self, slot: LearnerSlot) -> None:
        d = self.config.learner_dir(slot.id)
        d.mkdir(parents=True, exist_ok=True)
        addresses = cast(list[str], [s.address for s in self.shards])  # every shard started before any learner
        cmd = ddiloco_command(*self.config.learner_args(slot.id, addresses))
        slot.child = self.procs.start(f"learner-{slot.id}", cmd, d / "stderr.log", d / "stdout.log")
        slot.state, slot.restart_at, slot.started_at = "running", None, self.elapsed()
        self.events.write("learner_started", learner=slot.id, pid=slot.child.pid, restarts=slot.restarts)

    # --- chaos ----------------------------------------------------------------------------------
    def _apply(self, event: ChaosEvent) -> None:
        if self.stopping:
            return
        if event.kind == "kill_learner":
            slot = self.learners[event.target]
            if slot.child is not None and slot.child.signal(signal.SIGKILL):
                self.events.write("chaos_kill_learner", learner=slot.id, pid=slot.child.pid)
            slot.held_until_trace = True
            slot.state, slot.restart_at = "down", None
            self.straggling.pop(slot.id, None)
        elif event.kind == "restart_learner":
            slot = self.learners[event.target]
            slot.held_until_trace = False
            if slot.state == "down":
                slot.restart_at = self.elapsed()
        elif event.kind == "sigstop":
            candidates = [s.id for s in self.learners if s.state == "running" and s.id not in self.straggling]
            target = self.injector.pick(candidates)
            child = self.learners[target].child if target is not None else None
            seconds = self.config.chaos.straggle  # set wherever sigstop events are scheduled
            if target is not None and child is not None and seconds is not None and child.signal(signal.SIGSTOP):
                self.straggling[target] = self.elapsed() + seconds
                self.learners[target].state = "straggling"
                self.events.write("chaos_sigstop", learner=target, seconds=seconds)
        elif event.kind == "kill_sync":
            shard = self.shards[event.target]
            if shard.child is not None and shard.child.signal(signal.SIGKILL):
                shard.chaos_killed = True
                self.events.write("chaos_kill_synchronizer", shard=shard.index, pid=shard.child.pid)
        elif event.kind == "restart_sync":
            self.shards[event.target].restart_at = self.elapsed()

    def _resume_stragglers(self) -> None:
        now = self.elapsed()
        for m, until in list(self.straggling.items()):
            if now >= until or self.stopping:
                slot = self.learners[m]
                if slot.child is not None:
                    slot.child.signal(signal.SIGCONT)
                if slot.state == "straggling":
                    slot.state = "running"
                del self.straggling[m]
                self.events.write("chaos_sigcont", learner=m)

    # --- supervision ----------------------------------------------------------------------------
    def _check_learners(self) -> None:
        now = self.elapsed()
        for slot in self.learners:
            if slot.state in ("running", "straggling") and slot.child is not None and not slot.child.alive():
                code = slot.child.poll()
                self.events.write("learner_exited", learner=slot.id, pid=slot.child.pid, code=code)
                if self.stopping:
                    slot.state = "done"  # whatever the code: it was stopped (or stopped before it joined)
                elif code == 2:
                    slot.state = "failed"
                    self.error = (
                        f"learner {slot.id} failed (exit code 2); see {self.config.learner_dir(slot.id) / 'stderr.log'}"
                    )
                elif self._crash_loop(slot, code, now):
                    slot.state = "failed"
                    self.error = (
                        f"learner {slot.id} keeps crashing: exit code {code}, {slot.crashes} times in a "
                        f"row within {CRASH_WINDOW:g} s of starting; see "
                        f"{self.config.learner_dir(slot.id) / 'stderr.log'}"
                    )
                else:
                    slot.state = "down"
                    slot.restart_at = None if slot.held_until_trace else now + self.config.chaos.learner_down
            if slot.state == "down" and slot.restart_at is not None and now >= slot.restart_at and not self.stopping:
                slot.restarts += 1
                self.learner_restarts += 1
                self._start_learner(slot)

    @staticmethod
    def _crash_loop(slot: LearnerSlot, code: int | None, now: float) -> bool:
        """A learner that exits with an error soon after each start is broken, not unlucky: a kill
        (negative code) or a crash after a while of training starts the count anew."""
        if code is not None and code > 0 and now - slot.started_at < CRASH_WINDOW:
            slot.crashes += 1
        else:
            slot.crashes = 0
        return slot.crashes >= MAX_CRASHES

    def _check_shards(self) -> None:
        now = self.elapsed()
        for shard in self.shards:
            child = shard.child
            if shard.state == "running" and child is not None and not child.alive():
                code = child.poll()
                if code == 0:  # a synchronizer only exits 0 once its run is over and drained
                    shard.state = "done"
                    if not self.stopping:
                        self._mark_stopping("synchronizer finished the run")
                    continue
                shard.state = "down"
                self.events.write("synchronizer_exited", shard=shard.index, pid=child.pid, code=code)
                if not shard.chaos_killed:  # crashed on its own: restart at once
                    shard.restart_at = now
                shard.chaos_killed = False
            if shard.state == "down" and shard.restart_at is not None and now >= shard.restart_at and not self.stopping:
                shard.restart_at = None
                shard.restarts += 1
                self._start_shard(shard)

    def _poll_status(self) -> None:
        for shard in self.shards:
            if shard.stubs is None or shard.child is None or not shard.child.alive():
                continue
            try:
                shard.status = framing.read_message(shard.stubs.call("Status", framing.message({}), self.timeouts.rpc))
            except grpc.RpcError:
                continue
            if shard.status.get("stopping") and not self.stopping:
                self._mark_stopping("synchronizer stopped the run")

    def _mark_stopping(self, reason: str) -> None:
        self.stopping = True
        self.stop_wall = time.time()
        self.events.write("stop", reason=reason)
        self._resume_stragglers()
        for shard in self.shards:  # the other shards stop too (each decides on its own otherwise)
            if shard.state == "running" and shard.stubs is not None:
                with contextlib.suppress(grpc.RpcError):
                    shard.stubs.call("Stop", framing.message({"reason": reason}), self.timeouts.rpc)

    # --- the run --------------------------------------------------------------------------------
    def run(self) -> None:
        """Start everything, supervise until the run is over, end every process."""
        cfg = self.config
        self.events.write("run_started", config=cfg.as_dict(), chaos=bool(cfg.chaos.active))
        try:
            try:
                for shard in self.shards:
                    self._start_shard(shard)
                for shard in self.shards:
                    self._wait_address(shard)
            except RuntimeError as exc:
                self.error = str(exc)
                return
            for slot in self.learners:
                self._start_learner(slot)
            last_status = 0.0
            limit = (cfg.duration or float("inf")) + 2 * self.timeouts.drain + 60
            while not self.interrupted.is_set() and self.error is None:
                for event in self.injector.due(self.elapsed()):
                    self._apply(event)
                self._resume_stragglers()
                self._check_shards()
                self._check_learners()
                if time.monotonic() - last_status >= STATUS_EVERY:
                    last_status = time.monotonic()
                    self._poll_status()
                    self.on_tick(self)
                if self.stopping and self._all_done():
                    break
                if self.elapsed() > limit:
                    self.error = f"the run did not finish within {limit:.0f} s"
                    break
                time.sleep(TICK)
            if self.interrupted.is_set() and not self.stopping:
                self._mark_stopping("interrupted")
                self._wait_until(self._learners_exited, self.timeouts.drain + 5)
        finally:
            if self.error is not None and not self.stopping:
                # the shards were never asked to stop: without this they are waited for drain + 10 s
                self._mark_stopping(f"error: {self.error}")
            self._resume_stragglers()
            self._wait_until(self._shards_exited, self.timeouts.drain + 10)
            self.procs.stop_all()
            self.events.write("run_finished", error=self.error, learner_restarts=self.learner_restarts)
            self.events.close()

    def _learners_exited(self) -> bool:
        return all(s.child is None or not s.child.alive() for s in self.learners)

    def _shards_exited(self) -> bool:
        return all(s.child is None or not s.child.alive() for s in self.shards)

    def _all_done(self) -> bool:
        self._check_learners()
        if self._shards_exited() and not self._learners_exited() and not self._terminated_learners:
            # the run is over and its synchronizer gone: a learner still (re)starting has nothing to join
            self._terminated_learners = True
            for slot in self.learners:
                if slot.child is not None and slot.child.alive():
                    slot.child.signal(signal.SIGCONT)
                    slot.child.signal(signal.SIGTERM)
                    self.events.write("learner_terminated", learner=slot.id, pid=slot.child.pid)
        return self._learners_exited() and self._shards_exited()

    def _wait_until(self, condition: Callable[[], bool], timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while not condition() and time.monotonic() < deadline:
            time.sleep(TICK)

    # --- views ----------------------------------------------------------------------------------
    def learner_rows(self) -> list[dict]:
        status: dict = {}
        for shard in self.shards:
            for m, info in shard.status.get("learners", {}).items():
                status.setdefault(int(m), info)
        rows = []
        for slot in self.learners:
            info = status.get(slot.id, {})
            books = [s.status.get("books", {}).get(str(slot.id), {}) for s in self.shards]
            state = slot.state
            trained = max((b.get("tokens_trained", 0) for b in books), default=0)  # all incarnations
            if state == "running" and not info:
                # no session: not registered yet; or, with work booked, left at the run's end or cut off
                state = ("left" if self.stopping else "reconnecting") if trained else "starting"
            elif state == "running" and not info.get("step"):
                state = "joining"  # registered, loading the global model, no step yet
            rows.append(
                {
                    "id": slot.id,
                    "state": state,
                    "pid": slot.child.pid if slot.child else None,
                    "restarts": slot.restarts,
                    "step": info.get("step"),
                    "tokens": info.get("tokens"),
                    "tokens_trained": trained,
                    "tokens_merged": sum(b.get("tokens_merged", 0.0) for b in books),
                    "loss": info.get("loss"),
                    "overlap": info.get("overlap"),  # the tau it uses (`--overlap auto` chooses it)
                    "link_seconds": info.get("link_seconds"),
                    "last_merge_wall": info.get("last_merge_wall"),
                }
            )
        return rows

    def shard_dirs(self) -> list[Path]:
        return [self.config.sync_dir(s.index) for s in self.shards]

    def learner_dirs(self) -> list[Path]:
        return [self.config.learner_dir(m) for m in range(self.config.learners)]
