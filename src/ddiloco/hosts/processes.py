"""The processes a network started inside its hosts, and how they are stopped: only ours, by PID.

Each process leads a process group of its own (a new session), so stopping it reaches the children
it made (a learner's workers) and nothing else. Signals go to a group only while its leader has not
been reaped: until then the kernel keeps the PID, so the group id cannot name someone else's processes.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import threading
import time
from collections.abc import Sequence
from typing import Any

POLL_S = 0.05


def _exited(pid: int) -> bool:
    """True once the process ended; it stays unreaped (a zombie), so its PID stays ours."""
    try:
        info = os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT)
    except ChildProcessError:
        return True  # reaped already (Popen.poll or wait elsewhere)
    return info is not None and info.si_pid == pid


def _signal_group(proc: subprocess.Popen[Any], sig: int) -> None:
    if proc.returncode is not None:
        return  # reaped: the PID and group id may belong to another process by now
    with contextlib.suppress(ProcessLookupError):  # the group is empty already
        os.killpg(proc.pid, sig)


class ProcessGroups:
    """Starts processes in new sessions, remembers every one, and stops them all (idempotently)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._procs: list[subprocess.Popen[Any]] = []

    def start(self, argv: Sequence[str], **popen_kwargs: Any) -> subprocess.Popen[Any]:
        if "start_new_session" in popen_kwargs or "process_group" in popen_kwargs or "preexec_fn" in popen_kwargs:
            raise ValueError("the process group is the network's own: it is how the process is stopped")
        proc: subprocess.Popen[Any] = subprocess.Popen(list(argv), start_new_session=True, **popen_kwargs)
        with self._lock:
            self._procs.append(proc)
        return proc

    @property
    def pids(self) -> list[int]:
        with self._lock:
            return [p.pid for p in self._procs]

    def stop_all(self, grace: float = 5.0) -> None:
        """SIGTERM every live group, wait up to `grace` for their leaders, then SIGKILL the groups
        (their leaders' PIDs still held) and reap. Safe to call more than once."""
        with self._lock:
            procs = list(self._procs)
        for p in procs:
            _signal_group(p, signal.SIGTERM)
        deadline = time.monotonic() + grace
        for p in procs:
            while p.returncode is None and not _exited(p.pid) and time.monotonic() < deadline:
                time.sleep(POLL_S)
        for p in procs:
            _signal_group(p, signal.SIGKILL)  # also the leader's children, should it have ended alone
            with contextlib.suppress(subprocess.TimeoutExpired):  # in the kernel's hands (D state)
                p.wait(timeout=10.0)
            for stream in (p.stdin, p.stdout, p.stderr):
                if stream is not None:
                    stream.close()
