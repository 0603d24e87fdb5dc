"""Process fixtures for the runtime's multi-process tests: every process is ended by its PID."""

from __future__ import annotations

import os

import pytest

from ddiloco.net.launch.procs import ProcessTable


@pytest.fixture()
def procs():
    table = ProcessTable()
    yield table
    table.stop_all(grace=5.0)
    leftovers = [c.pid for c in table.children if c.alive()]
    assert not leftovers, f"processes left running: {leftovers}"
    for c in table.children:  # reaped: the PID no longer names our child
        with pytest.raises(ChildProcessError):
            os.waitpid(c.pid, os.WNOHANG)
