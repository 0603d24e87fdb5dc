"""A learner pointed at an address where no synchronizer answers says so and gives up after
--connect-timeout (issue 13: it used to retry silently for a fixed 120 s)."""

from __future__ import annotations

import socket
import subprocess
import time

from ddiloco.launch.procs import ddiloco_command

from ..support.processes import model_args


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_unreachable_synchronizer_ends_in_exit_code_2_after_the_timeout(tmp_path, shakespeare):
    address = f"127.0.0.1:{closed_port()}"
    cmd = ddiloco_command(
        "learner",
        "--connect",
        address,
        "--id",
        "0",
        *model_args(shakespeare, 2),
        "--threads",
        "1",
        "--connect-timeout",
        "3",
    )
    started = time.monotonic()
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert out.returncode == 2, out.stderr[-2000:]
    assert time.monotonic() - started >= 3.0
    assert f"no answer from synchronizer {address}" in out.stderr and "Traceback" not in out.stderr
    assert "WARNING" in out.stderr and "does not answer yet" in out.stderr  # seen at the default log level
