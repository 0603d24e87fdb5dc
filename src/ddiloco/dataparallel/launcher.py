"""The data-parallel launcher: start M workers, inject the same chaos as `ddiloco run`, and decide
each generation of the job.

    ddp          a worker that dies takes the job down: the launcher ends every other worker (by
                 PID) and starts all M again once the dead one's down time is over; they resume
                 from the last checkpoint, and the steps since it are lost.
    elastic-ddp  a worker that dies is left out of the next generation at once: the survivors go on
                 with fewer workers (at least --min-workers) from the state they hold; its
                 replacement is started after its down time and taken back into the generation
                 after, from the survivors' state.

The launcher polls every `TICK` seconds. It writes the launcher events of `ddiloco run`
(events.jsonl: learner_started, learner_exited, chaos_*, join, down, stop) and, per generation, a
line in dataparallel.jsonl (members, when it formed, at which step). Every process is ended by PID.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import threading
import time
from dataclasses import dataclass

from ..chaos.injector import ChaosEvent, ChaosInjector
from ..launch.procs import Child, ProcessTable
from ..records.events import EventLog
from .config import DataParallelConfig
from .rendezvous import HOST, Coordinator
from .storeauth import read_secret, write_secret

TICK = 0.05
MAX_CRASHES = 3  # a worker that exits with an error this many times in a row, each within CRASH_WINDOW
CRASH_WINDOW = 60.0  # of its start, ends the run with an error instead of being restarted forever


def loopback_interface() -> str | None:
    """The name of the loopback interface (`lo` on Linux, `lo0` on macOS), if this host has one."""
    names = {name for _, name in socket.if_nameindex()}
    return next((n for n in ("lo", "lo0") if n in names), None)


def local_env() -> dict[str, str]:
    """The workers' environment for a local run: gloo listens on the loopback interface only."""
    env = dict(os.environ)
    interface = loopback_interface()
    if interface is not None:
        env["GLOO_SOCKET_IFNAME"] = interface
    return env


@dataclass
class WorkerSlot:
    id: int
    child: Child | None = None
    state: str = "down"  # running | straggling | down | done | failed
    restart_at: float | None = 0.0  # None: held down until the chaos trace brings it back
    restarts: int = 0
    held: bool = False  # killed by the chaos trace: back only with its restart_learner event
    started_at: float = 0.0
    crashes: int = 0  # exits with an error in a row, each soon after its start


class Launcher:
    backend = "local"  # where the workers run (`slurm.SlurmLauncher`: Slurm jobs)

    def __init__(self, config: DataParallelConfig, store_host: str = HOST, env: dict[str, str] | None = None) -> None:
        self.config, self.store_host = config, store_host
        config.run_dir.mkdir(parents=True, exist_ok=True)
        # gloo's own sockets: on loopback for a local run (by default it binds what the host name resolves to)
        self.procs = ProcessTable(env if env is not None else local_env() if store_host == HOST else None)
        self.events = EventLog(config.run_dir / "events.jsonl")
        self.log = open(config.run_dir / "dataparallel.jsonl", "a", buffering=1)
        self.secret_file = write_secret(config.run_dir)  # the store's values are signed with it
        secret = read_secret(self.secret_file)
        self.coordinator = Coordinator(timeout=config.collective_timeout, host=store_host, secret=secret)
        self.injector = ChaosInjector(config.chaos, config.workers, config.horizon)
        if self.injector.trace.outages:
            self.injector.trace.save(config.run_dir / "chaos-trace.csv")
        self.slots = [WorkerSlot(m) for m in range(config.workers)]
        self.t0, self.start_wall = time.monotonic(), time.time()
        self.pids: dict[int, int] = {}  # the current generation's members -> their PIDs when it opened
        self.opened_at = 0.0
        self.formed_seen: set[int] = set()
        self.straggling: dict[int, float] = {}
        self.job_restarts = 0
        self.worker_restarts = 0
        self.stopping = False
        self.error: str | None = None
        self.interrupted = threading.Event()
        self.unformed_for = 0.0  # seconds with the workers a generation needs running and none formed

    def elapsed(self) -> float:
        return time.monotonic() - self.t0

    def _note(self, kind: str, **fields: object) -> None:
        self.log.write(json.dumps({"t": time.time(), "kind": kind, **fields}) + "\n")

    # --- workers --------------------------------------------------------------------------------
    def _start(self, slot: WorkerSlot) -> None:
        d = self.config.worker_dir(slot.id)
        d.mkdir(parents=True, exist_ok=True)
        cmd = self.config.worker_command(slot.id, self.coordinator.port, self.start_wall, self.secret_file)
        if self.store_host != HOST:  # the store listens on another address (`hosted`: the launcher's host)
            cmd += ["--store-host", self.store_host]
        slot.child = self.procs.start(f"worker-{slot.id}", cmd, d / "stderr.log", d / "stdout.log")
        slot.state, slot.restart_at, slot.started_at = "running", None, self.elapsed()
        self.events.write("learner_started", learner=slot.id, pid=slot.child.pid, restarts=slot.restarts)

    def _alive(self, slot: WorkerSlot) -> bool:
        return slot.child is not None and slot.child.alive() and slot.state in ("running", "straggling")

    def _running(self, slot: WorkerSlot) -> bool:
        """Its process exists and runs (a Slurm job still queued does not: `slurm.SlurmLauncher`)."""
        return self._alive(slot)

    def _ready(self, slot: WorkerSlot) -> bool:
        """Alive, not frozen, and this very process said hello (not an earlier one of its slot)."""
        if slot.state != "running" or slot.child is None or not slot.child.alive():
            return False
        return self.coordinator.hello_pid(slot.id) == slot.child.pid

    def _check_workers(self) -> None:
        now = self.elapsed()
        for slot in self.slots:
            child = slot.child
            if slot.state in ("running", "straggling") and child is not None and not child.alive():
                code = child.poll()
                self.events.write("learner_exited", learner=slot.id, pid=child.pid, code=code)
                if self.stopping or code == 0:
                    slot.state = "done"
                    continue
                self.events.write("down", learner=slot.id)
                crashed = code is not None and code > 0 and now - slot.started_at < CRASH_WINDOW
                slot.crashes = slot.crashes + 1 if crashed else 0
                if slot.crashes >= MAX_CRASHES:  # broken, not unlucky: a kill or a late crash starts the count anew
                    slot.state = "failed"
                    self.error = (
                        f"worker {slot.id} keeps crashing (exit code {code}); see {self.config.worker_dir(slot.id)}"
                    )
                    continue
                slot.state = "down"
                if slot.restart_at is None and not slot.held:
                    slot.restart_at = now + self.config.learner_down
                if not self.config.elastic and slot.id in self.pids:
                    self._restart_job(f"worker {slot.id} exited with code {code}")
            if slot.state == "down" and slot.restart_at is not None and now >= slot.restart_at and not self.stopping:
                slot.restarts += 1
                self.worker_restarts += 1
                self._start(slot)

    def _restart_job(self, reason: str) -> None:
        """ddp: end every worker of the broken job; each starts again at once (the dead one after its
        down time) and the next generation resumes from the checkpoint."""
        self.job_restarts += 1
        self._note("job_restart", reason=reason, generation=self.coordinator.generation)
        self.pids = {}
        for slot in self.slots:
            if slot.child is not None and self._alive(slot):
                self.procs.kill_tree(slot.child)
                self.events.write("learner_terminated", learner=slot.id, pid=slot.child.pid)
                slot.state, slot.restart_at = "down", self.elapsed()
                self.straggling.pop(slot.id, None)

    # --- generations ----------------------------------------------------------------------------
    def _healthy(self) -> bool:
        """The current generation still has every member it opened with, and none saw a failure."""
        if not self.pids:
            return False
        g = self.coordinator.generation
        for m, pid in self.pids.items():
            slot = self.slots[m]
            if not self._alive(slot) or slot.child is None or slot.child.pid != pid:
                return False
            if self.coordinator.failed_in(m) >= g:
                return False
        return True

    def _decide(self) -> None:
        ready = [s.id for s in self.slots if self._ready(s)]
        healthy = self._healthy()
        if not self.config.elastic:
            if self.pids and not healthy:
                self._restart_job("a collective failed")
            elif not self.pids and len(ready) == self.config.workers:
                self._open(ready)
            return
        if not self.pids:  # the first generation waits for every worker that is starting
            starting = [s.id for s in self.slots if self._alive(s) and s.id not in ready]
            if ready and not starting and len(ready) >= self.config.min_workers:
                self._open(ready)
            return
        current = list(self.pids)
        # A frozen member stays in until its peers' collective times out (the launcher's knowledge of
        # the freeze is not used: a real job has none); then the generation is not healthy any more.
        kept = ready + [m for m in current if self.slots[m].state == "straggling"] if healthy else ready
        desired = [m for m in current if m in kept] + sorted(m for m in ready if m not in current)
        forming = self.coordinator.formed(self.coordinator.generation) is None
        patience = self.elapsed() - self.opened_at < self.config.collective_timeout + 5
        if healthy and (set(desired) == set(current) or forming and patience):
            return  # nothing changed, or a healthy generation is still forming: let it
        if len(desired) >= self.config.min_workers:
            self._open(desired)

    def _open(self, members: list[int]) -> None:
        g = self.coordinator.open(members)
        self.pids = {m: child.pid for m in members if (child := self.slots[m].child) is not None}
        self.opened_at = self.elapsed()
        self._note("generation", generation=g, members=members)

    def _watch_formed(self) -> None:
        """Record each generation that formed, also one a newer generation soon replaced."""
        newest = self.coordinator.generation
        for g in range(max(1, newest - 4), newest + 1):
            info = None if g in self.formed_seen else self.coordinator.formed(g)
            if info is not None:
                self.formed_seen.add(g)
                self._note("formed", generation=g, **info)
                for m in info.get("members", []):
                    self.events.write("join", learner=m, versions=[g])

    # --- chaos ----------------------------------------------------------------------------------
    def _apply(self, event: ChaosEvent) -> None:
        if self.stopping or event.target >= len(self.slots) and event.target != -1:
            return
        if event.kind == "kill_learner":
            slot = self.slots[event.target]
            if slot.child is not None and slot.child.signal(signal.SIGKILL):
                self.events.write("chaos_kill_learner", learner=slot.id, pid=slot.child.pid)
            slot.held = True
            slot.restart_at = None
        elif event.kind == "restart_learner":
            slot = self.slots[event.target]
            slot.held = False
            if slot.state == "down":
                slot.restart_at = self.elapsed()
        elif event.kind == "sigstop" and self.config.chaos.straggle is not None:
            candidates = [s.id for s in self.slots if s.state == "running" and s.id not in self.straggling]
            target = self.injector.pick(candidates)
            child = self.slots[target].child if target is not None else None
            if target is not None and child is not None and child.signal(signal.SIGSTOP):
                self.straggling[target] = self.elapsed() + self.config.chaos.straggle
                self.slots[target].state = "straggling"
                self.events.write("chaos_sigstop", learner=target, seconds=self.config.chaos.straggle)

    def _resume_stragglers(self) -> None:
        for m, until in list(self.straggling.items()):
            if self.elapsed() >= until or self.stopping:
                slot = self.slots[m]
                if slot.child is not None:
                    slot.child.signal(signal.SIGCONT)
                if slot.state == "straggling":
                    slot.state = "running"
                del self.straggling[m]
                self.events.write("chaos_sigcont", learner=m)

    def _count_stall(self, seconds: float) -> None:
        """Add `seconds` to the time no generation has formed while the workers one needs were running
        (all M for ddp, --min-workers for elastic-ddp; a worker down, by a failure or the chaos trace,
        is waited for, not counted); a formed generation (as `_watch_formed` saw it) clears it. Past
        `stall_limit`, the run ends with an error saying what it waited for: workers hung before
        saying they were ready, or a generation whose members never reached each other."""
        g = self.coordinator.generation
        if self.pids and g in self.formed_seen:  # `_watch_formed` read the store this tick
            self.unformed_for = 0.0
            return
        needed = self.config.min_workers if self.config.elastic else self.config.workers
        running = [s for s in self.slots if self._running(s)]
        if len(running) < needed:
            return
        self.unformed_for += seconds
        if self.unformed_for <= self.config.stall_limit:
            return
        silent = [s.id for s in running if s.child is not None and self.coordinator.hello_pid(s.id) != s.child.pid]
        waited = (
            f"worker(s) {', '.join(map(str, silent))} never said they were ready"
            if silent
            else f"generation {g} of workers {', '.join(map(str, self.pids))} never formed"
        )
        self.error = (
            f"no generation formed in {self.config.stall_limit:.0f} s with the workers running: {waited} "
            f"(see {self.config.run_dir}/learner-*/stderr.log)"
        )

    # --- the run --------------------------------------------------------------------------------
    def run(self) -> None:
        """Start everything, decide generations until the run is over, end every process."""
        cfg = self.config
        self.events.write("run_started", config=cfg.as_dict(), chaos=bool(cfg.chaos.active))
        try:
            for slot in self.slots:
                self._start(slot)
            last = self.elapsed()
            while not self.interrupted.is_set() and self.error is None:
                for event in self.injector.due(self.elapsed()):
                    self._apply(event)
                self._resume_stragglers()
                self._check_workers()
                if self.coordinator.stopped() and not self.stopping:
                    self.stopping = True
                    self.events.write("stop", reason="budget reached")
                    self._resume_stragglers()
                if self.stopping:
                    if not any(s.child is not None and s.child.alive() for s in self.slots):
                        break
                else:
                    self._decide()
                self._watch_formed()
                now = self.elapsed()
                if not self.stopping:
                    self._count_stall(now - last)
                last = now
                if now > cfg.time_limit:
                    self.error = f"the run did not finish within {cfg.time_limit:.0f} s"
                if self.error is not None:
                    break
                time.sleep(TICK)
            if self.interrupted.is_set() and not self.stopping:
                self.error = self.error or "interrupted"
        finally:
            self._resume_stragglers()
            self.procs.stop_all(grace=cfg.collective_timeout if self.stopping else 5.0)
            self.events.write("run_finished", error=self.error, learner_restarts=self.worker_restarts)
            self.events.close()
            self.log.close()
