"""Running tests/hosts/peers.py inside a host and reading what it says, every read with a timeout."""

from __future__ import annotations

import json
import os
import queue
import subprocess
import sys
import threading
from pathlib import Path

PEERS = str(Path(__file__).with_name("peers.py"))


class Peer:
    """One peers.py process in a host; its JSON lines are read by a thread into a queue."""

    def __init__(self, net, host: str, *args: object) -> None:
        self.proc = net.popen(
            host,
            [sys.executable, PEERS, *map(str, args)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        self.lines: queue.Queue[dict | None] = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.put(json.loads(line))
        self.lines.put(None)

    def line(self, timeout: float = 60.0) -> dict:
        """The next thing the peer said; fails the test if it said nothing within `timeout`."""
        try:
            got = self.lines.get(timeout=timeout)
        except queue.Empty:
            raise AssertionError(f"peer {self.proc.args[-6:]} said nothing within {timeout} s") from None
        if got is None:
            err = self.proc.stderr.read() if self.proc.stderr else ""
            raise AssertionError(f"peer {self.proc.args[-6:]} ended without a word: {err}")
        return got

    def tell(self) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write("\n")
        self.proc.stdin.flush()

    def all_lines(self, timeout: float = 60.0) -> list[dict]:
        """Everything the peer says until it ends (it ends by itself)."""
        self.proc.wait(timeout)
        out = []
        while (got := self.lines.get(timeout=timeout)) is not None:
            out.append(got)
        return out


def alive(pid: int) -> bool:
    """Whether `pid` is a running (not zombie) process."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, IndexError):
        return False
    return state != "Z"
