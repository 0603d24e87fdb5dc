"""Child processes, tracked and ended by PID only.

Every process the launcher (or a test) starts goes through `ProcessTable`, which remembers it and,
at the end, sends SIGTERM, waits, then SIGKILL to exactly those PIDs that are still running. Nothing
is ever matched by name. Children get their own session (`start_new_session`) so that a Ctrl+C in
the terminal reaches only the launcher, which then stops them in order.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path


def ddiloco_command(*args: str) -> list[str]:
    """The `ddiloco` CLI run by this same interpreter."""
    return [sys.executable, "-m", "ddiloco", *args]


@dataclass
class Child:
    name: str
    popen: subprocess.Popen
    log_path: Path | None
    started: float = field(default_factory=time.time)
    stopped_by_us: bool = False

    @property
    def pid(self) -> int:
        return self.popen.pid

    def poll(self) -> int | None:
        return self.popen.poll()

    def alive(self) -> bool:
        return self.popen.poll() is None

    def signal(self, sig: int) -> bool:
        """Send `sig` to this child's PID if it is still running."""
        if self.popen.poll() is not None:
            return False
        try:
            os.kill(self.popen.pid, sig)
            return True
        except ProcessLookupError:
            return False


def _stat(pid: int) -> tuple[int, int] | None:
    """(parent PID, start time in clock ticks) of a live process, from /proc; None if it is gone."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None
    return int(fields[1]), int(fields[19])


def descendants(pid: int) -> list[tuple[int, int]]:
    """Every live descendant of `pid` as (PID, start time), so that it can be ended by PID later even
    after the kill of `pid` has orphaned it (a DataLoader worker, a forkserver). Linux only; [] elsewhere."""
    proc = Path("/proc")
    if not proc.is_dir():
        return []
    children: dict[int, list[tuple[int, int]]] = {}
    for entry in proc.iterdir():
        if entry.name.isdigit():
            stat = _stat(int(entry.name))
            if stat is not None:
                children.setdefault(stat[0], []).append((int(entry.name), stat[1]))
    found, todo = [], [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            found.append(child)
            todo.append(child[0])
    return found


def kill_descendants(found: list[tuple[int, int]]) -> None:
    """SIGKILL each (PID, start time) that still names the same process."""
    for pid, started in found:
        stat = _stat(pid)
        if stat is not None and stat[1] == started:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)


class ProcessTable:
    def __init__(self, env: dict | None = None) -> None:
        self.children: list[Child] = []
        self.env = env
        self.wrap: Callable[[str, Sequence[str]], list[str]] | None = None  # (name, command): where it runs

    def start(
        self, name: str, command: Sequence[str], log_path: Path | None = None, stdout_path: Path | None = None
    ) -> Child:
        """Start `command`; stderr goes to log_path, stdout to stdout_path (default: the same log)."""
        err = open(log_path, "ab") if log_path is not None else subprocess.DEVNULL
        out = open(stdout_path, "ab") if stdout_path is not None else err
        env = dict(os.environ if self.env is None else self.env)
        env.setdefault("PYTHONUNBUFFERED", "1")
        if self.wrap is not None:  # e.g. on a host of its own (`ip netns exec`, ddiloco.hosts.run)
            command = self.wrap(name, command)
        try:
            popen = subprocess.Popen(
                list(command), stdout=out, stderr=err, stdin=subprocess.DEVNULL, env=env, start_new_session=True
            )
        finally:
            for f in {id(err): err, id(out): out}.values():
                if hasattr(f, "close"):
                    f.close()
        child = Child(name, popen, log_path)
        self.children.append(child)
        return child

    def kill_tree(self, child: Child) -> None:
        """kill -9 of `child`, then of every process it had started: a crash, without orphans left behind."""
        found = descendants(child.pid)
        child.signal(signal.SIGKILL)
        child.popen.wait(timeout=10)
        kill_descendants(found)

    def running(self) -> list[Child]:
        return [c for c in self.children if c.alive()]

    def stop_all(self, grace: float = 5.0) -> None:
        """SIGTERM every child still running, wait up to `grace` seconds, SIGKILL the rest; reap all."""
        for c in self.running():
            c.stopped_by_us = True
            c.signal(signal.SIGCONT)  # a stopped (straggling) process cannot handle SIGTERM
            c.signal(signal.SIGTERM)
        deadline = time.monotonic() + grace
        while self.running() and time.monotonic() < deadline:
            time.sleep(0.05)
        for c in self.running():
            c.signal(signal.SIGKILL)
        for c in self.children:
            with contextlib.suppress(subprocess.TimeoutExpired):
                c.popen.wait(timeout=5)
