"""Where a learner finds a synchronizer shard: a fixed host:port, or `@FILE`, an address file the
shard writes (`ddiloco synchronizer --address-file`).

An address file is read again whenever the shard stops answering, so a shard that comes back with a
new address (a Slurm job requeued onto another node, a process restarted on a new port) is found
without restarting the learner. A missing, empty or malformed file keeps the last good address: a
shard that is restarting removes or rewrites its file, and a half-written one is never taken.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from pathlib import Path

from ..wire.rpc import check_address

log = logging.getLogger(__name__)
MAX_FILE_BYTES = 4096


def is_file_spec(spec: str) -> bool:
    return spec.startswith("@")


def check_spec(spec: str) -> None:
    """host:port is checked as an address; @FILE only for a non-empty path (the file may not exist yet)."""
    if is_file_spec(spec):
        if not spec[1:].strip():
            raise ValueError("an address file must be given as @PATH, for example @run/sync-0/address")
    else:
        check_address(spec)


def read_file(path: Path) -> str | None:
    """The valid address in `path`, or None (missing, empty, too large or malformed)."""
    try:
        with open(path, "rb") as f:
            data = f.read(MAX_FILE_BYTES + 1)
    except OSError:
        return None
    if not data or len(data) > MAX_FILE_BYTES:
        return None
    try:
        address = data.decode().strip()
        check_address(address)
    except (UnicodeDecodeError, ValueError):
        return None
    return address


def resolve(spec: str) -> str:
    """The address a spec names now; a ValueError that names the file when it holds none."""
    if not is_file_spec(spec):
        return spec
    address = read_file(Path(spec[1:]))
    if address is None:
        raise ValueError(
            f"no synchronizer address in {spec[1:]} (missing, empty or not host:port): is the "
            "synchronizer started with --address-file there?"
        )
    return address


def wait_resolved(specs: list[str], deadline: float, closing: Callable[[], bool] = lambda: False) -> list[str]:
    """Every spec's address, waiting (bounded by `deadline`, monotonic) for address files to appear."""
    last_log = time.monotonic()
    while True:
        try:
            return [resolve(s) for s in specs]
        except ValueError as exc:
            now = time.monotonic()
            if now >= deadline or closing():
                raise ConnectionError(str(exc)) from None
            if now - last_log > 5.0:
                last_log = now
                log.warning("%s; waiting %.0f s more", exc, deadline - now)
            time.sleep(min(0.2, max(0.0, deadline - now)))


def reread(spec: str, current: str) -> str | None:
    """A new address if `spec` is a file that now names another one, else None."""
    if not is_file_spec(spec):
        return None
    address = read_file(Path(spec[1:]))
    return address if address is not None and address != current else None
