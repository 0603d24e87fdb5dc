"""What every example's parent does with its learners: starts them as child processes, shows what they
print, and waits for the run, failing fast when a learner dies before the run is over (naming the
learner and its last error) rather than waiting out the synchronizer's timeout.

Not part of ddiloco: each example imports it from beside itself. `corpus_bytes` is the examples' data: the
text at `--data` (a file or a folder), or with none the Python standard library's own sources, which
every machine with Python has, so an example runs from a clone with nothing beside it.
"""

from __future__ import annotations

import collections
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Protocol

import ddiloco


def corpus_bytes(data: str | Path | None) -> bytes:
    """The examples' training text as bytes (byte-level models): `data`, or the stdlib sources. A
    missing or empty `data` ends the example with one line."""
    try:
        return ddiloco.read_corpus(data).encode()
    except (OSError, ValueError) as exc:  # a user's mistake: one line, exit code 2 (as the CLI's)
        print(f"--data: {exc}", file=sys.stderr)
        sys.exit(2)


class Run(Protocol):
    def wait(self, timeout: float | None = None) -> bool: ...
    def request_stop(self, reason: str = ...) -> None: ...
    def stop(self) -> None: ...


class Learner:
    """One learner process; its stderr is passed through line by line, and the last lines are kept."""

    def __init__(self, learner_id: int, cmd: list[str]) -> None:
        self.id = learner_id
        self.proc = subprocess.Popen(cmd, stderr=subprocess.PIPE, text=True, errors="replace")
        self.tail: collections.deque[str] = collections.deque(maxlen=20)
        self._reader = threading.Thread(target=self._pass_through, daemon=True)
        self._reader.start()

    def _pass_through(self) -> None:
        assert self.proc.stderr is not None
        for line in self.proc.stderr:
            sys.stderr.write(line)
            if line.strip():
                self.tail.append(line.rstrip())

    def last_error(self) -> str:
        """The learner's last words: the exception line of a traceback, or its last line."""
        self._reader.join(timeout=5)
        lines = list(self.tail)
        errors = [line for line in lines if not line.startswith((" ", "Traceback"))]
        return (errors or lines or ["(it printed nothing)"])[-1]


def start_learners(cmd: list[str], learners: int) -> list[Learner]:
    """`cmd` + [learner id] for each learner."""
    return [Learner(m, [*cmd, str(m)]) for m in range(learners)]


def wait_for_run(run: Run, learners: list[Learner], timeout: float = 600.0) -> tuple[bool, list[int]]:
    """(whether the run finished, the learners' exit codes). Exits the example with a one-line reason
    as soon as a learner exits with an error before the run is over."""
    deadline = time.monotonic() + timeout
    finished = False
    while not finished and time.monotonic() < deadline:
        finished = run.wait(timeout=1.0)
        dead = [lr for lr in learners if lr.proc.poll() not in (None, 0)]
        if dead and not finished:
            run.request_stop("a learner failed")
            for lr in learners:
                if lr.proc.poll() is None:
                    lr.proc.terminate()
            for lr in learners:
                lr.proc.wait(timeout=60)
            run.stop()
            first = dead[0]
            code = first.proc.returncode
            sys.exit(f"learner {first.id} exited with code {code} before the run ended: {first.last_error()}")
    codes = []
    for lr in learners:
        try:
            codes.append(lr.proc.wait(timeout=120))
        except subprocess.TimeoutExpired:
            lr.proc.kill()
            codes.append(lr.proc.wait())
    return finished, codes
