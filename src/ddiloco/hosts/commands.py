"""Running `ip` and `tc` with argument lists (never a shell string), and the one check that says why
hosts cannot be made on this machine, so a test can skip with that reason instead of failing."""

from __future__ import annotations

import json
import os
import shutil
import subprocess

COMMAND_TIMEOUT_S = 30.0  # one `ip`/`tc` call; a hung one must not hang a test or a teardown


class HostsUnavailable(RuntimeError):
    """This machine cannot make hosts: not root, `ip`/`tc` missing, or namespaces refused."""


class NetemUnavailable(RuntimeError):
    """Latency, jitter or loss was asked for, and this kernel has no `netem` qdisc to make them."""


class CommandFailed(RuntimeError):
    """An `ip` or `tc` call failed; carries the argument list and what the command said."""

    def __init__(self, argv: list[str], returncode: int, stderr: str) -> None:
        super().__init__(f"{' '.join(argv)} exited {returncode}: {stderr.strip()}")
        self.argv = argv
        self.returncode = returncode
        self.stderr = stderr


def unavailable_reason() -> str | None:
    """Why hosts cannot be made here, or None when they (probably) can."""
    if os.geteuid() != 0:
        return f"network namespaces need root (effective uid is {os.geteuid()})"
    for tool in ("ip", "tc"):
        if shutil.which(tool) is None:
            return f"`{tool}` (iproute2) is not installed"
    return None


def require_hosts() -> None:
    """Raise HostsUnavailable with the reason, before anything is made."""
    reason = unavailable_reason()
    if reason is not None:
        raise HostsUnavailable(reason)


def run(argv: list[str], *, check: bool = True) -> subprocess.CompletedProcess[str]:
    """Run one command and capture its output; raise CommandFailed (with stderr) when `check`."""
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=COMMAND_TIMEOUT_S, check=False)
    except subprocess.TimeoutExpired as e:
        raise CommandFailed(argv, -1, f"no answer within {COMMAND_TIMEOUT_S:.0f} s") from e
    if check and done.returncode != 0:
        raise CommandFailed(argv, done.returncode, done.stderr)
    return done


def ip(*args: str, netns: str | None = None, check: bool = True) -> subprocess.CompletedProcess[str]:
    """`ip [-n NETNS] ARGS...`."""
    return run(["ip", *(["-n", netns] if netns else []), *args], check=check)


def tc(*args: str, netns: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    """`tc -n NETNS ARGS...`: always inside one of our namespaces, never the root one."""
    return run(["tc", "-n", netns, *args], check=check)


def netns_names() -> set[str]:
    """The names of every network namespace `ip netns` knows (ours and others')."""
    out = ip("-j", "netns", "list").stdout.strip()
    return {entry["name"] for entry in json.loads(out)} if out else set()


def json_of(done: subprocess.CompletedProcess[str]) -> list[dict]:
    """The JSON list an `ip -j`/`tc -j` call printed (empty when it printed nothing)."""
    out = done.stdout.strip()
    return list(json.loads(out)) if out else []
