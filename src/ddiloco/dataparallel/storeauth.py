"""What keeps the rendezvous store to the run's own processes (issue 46).

torch's TCPStore has no authentication, and given a host name it listens on every interface. So:

    where       the launcher's store listens on a socket it bound itself (`listening_socket`) to one
                address: 127.0.0.1 for a local run, the `--sync-host` address on Slurm, never *:port.
    who         every value our processes and gloo's rendezvous write is signed (`SignedStore`: an
                HMAC-SHA256 of the scope, key and value under a per-run secret), and a value whose
                signature does not check is refused as forged. Someone who reaches the port can still
                delete or garble keys (a run that stalls, then ends with an error), but cannot name a
                generation's members, stop the run, report a failure or point gloo at their address.
    the secret  32 random bytes the launcher writes to `store.secret` in the run directory, mode 0600
                (a Slurm job reads it on the shared file system); workers get the file's path, never
                the secret, on their command line.

Counters (`add`) are not signed: gloo's barrier counts with them, and a wrong count only stalls.
"""

from __future__ import annotations

import datetime
import hashlib
import hmac
import os
import secrets
import socket
from pathlib import Path

import torch.distributed as dist

SECRET_FILE = "store.secret"
MAC_BYTES = 64  # hex of SHA-256


class ForgedValue(RuntimeError):
    """A store value not signed with the run's secret (a RuntimeError: gloo's callers expect one)."""


def write_secret(run_dir: Path) -> Path:
    """A fresh secret in `run_dir/store.secret`, readable by its owner only (0600 before any byte)."""
    path = run_dir / SECRET_FILE
    path.unlink(missing_ok=True)  # a file left by an earlier run may have other modes: make it anew
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(secrets.token_hex(32))
    return path


def read_secret(path: Path) -> bytes:
    secret = path.read_text().strip().encode()
    if len(secret) < 32:
        raise ValueError(f"{path}: not a store secret (too short)")
    return secret


def listening_socket(host: str) -> socket.socket:
    """A TCP socket bound to `host` (one address, never all interfaces) on a free port, listening."""
    family, kind, proto, _, address = socket.getaddrinfo(host, 0, type=socket.SOCK_STREAM)[0]
    sock = socket.socket(family, kind, proto)
    try:
        sock.bind(address)
        sock.listen(128)
    except OSError:
        sock.close()
        raise
    return sock


def master_store(host: str, timeout: datetime.timedelta) -> tuple[dist.TCPStore, socket.socket]:
    """The launcher's store, on a socket bound to `host` only. The socket is returned to be kept open
    as long as the store lives (the store serves on its file descriptor)."""
    sock = listening_socket(host)
    port = sock.getsockname()[1]
    store = dist.TCPStore(
        host, port, is_master=True, wait_for_workers=False, timeout=timeout, master_listen_fd=sock.fileno()
    )
    return store, sock


class SignedStore(dist.Store):
    """A store whose values carry an HMAC of (scope, key, value): `get` refuses any other value.

    `scope` is mixed into every signature, so a value signed for one generation's process group is
    refused in another's (no replay of an old rank's address)."""

    def __init__(self, inner: dist.Store, secret: bytes, scope: str = "") -> None:
        super().__init__()
        self.inner, self.secret, self.scope = inner, secret, scope.encode()

    def _mac(self, key: str, value: bytes) -> bytes:
        message = self.scope + b"\0" + key.encode() + b"\0" + value
        return hmac.new(self.secret, message, hashlib.sha256).hexdigest().encode()

    def set(self, key: str, value: str | bytes) -> None:
        data = value if isinstance(value, bytes) else str(value).encode()
        self.inner.set(key, self._mac(key, data) + b":" + data)  # type: ignore[arg-type]  # bytes at runtime

    def get(self, key: str) -> bytes:
        raw = bytes(self.inner.get(key))
        mac, value = raw[:MAC_BYTES], raw[MAC_BYTES + 1 :]
        if raw[MAC_BYTES : MAC_BYTES + 1] != b":" or not hmac.compare_digest(mac, self._mac(key, value)):
            raise ForgedValue(f"the store's value of {key[:64]!r} is not signed with this run's secret")
        return value

    def add(self, key: str, amount: int) -> int:
        return int(self.inner.add(key, amount))

    def check(self, keys: list[str]) -> bool:
        return bool(self.inner.check(keys))

    def wait(self, keys: list[str], timeout: datetime.timedelta | None = None) -> None:
        if timeout is None:
            self.inner.wait(keys)
        else:
            self.inner.wait(keys, timeout)

    def delete_key(self, key: str) -> bool:
        return bool(self.inner.delete_key(key))

    def num_keys(self) -> int:
        return int(self.inner.num_keys())
