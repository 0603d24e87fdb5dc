"""The listening TCP sockets of a set of processes, read from /proc (no `ss` needed): a test of issue
46 asserts that a local run listens on nothing but loopback."""

from __future__ import annotations

import contextlib
import ipaddress
import os
import socket
import struct
from pathlib import Path

LISTEN = "0A"  # the state column of /proc/net/tcp*


def _address(hex_address: str, family: int) -> str:
    """/proc/net/tcp's address (32-bit words in host byte order) as text."""
    raw = bytes.fromhex(hex_address)
    words = b"".join(struct.pack("@I", struct.unpack(">I", raw[i : i + 4])[0]) for i in range(0, len(raw), 4))
    return socket.inet_ntop(family, words)


def _listening() -> dict[int, tuple[str, int]]:
    """inode -> (address, port) of every listening TCP socket of this network namespace."""
    found: dict[int, tuple[str, int]] = {}
    for name, family in (("tcp", socket.AF_INET), ("tcp6", socket.AF_INET6)):
        path = Path("/proc/net") / name
        if not path.is_file():
            continue
        for line in path.read_text().splitlines()[1:]:
            fields = line.split()
            if len(fields) > 9 and fields[3] == LISTEN:
                host, port = fields[1].split(":")
                found[int(fields[9])] = (_address(host, family), int(port, 16))
    return found


def _socket_inodes(pid: int) -> set[int]:
    inodes = set()
    with contextlib.suppress(OSError):
        for fd in os.listdir(f"/proc/{pid}/fd"):
            with contextlib.suppress(OSError):
                target = os.readlink(f"/proc/{pid}/fd/{fd}")
                if target.startswith("socket:["):
                    inodes.add(int(target[8:-1]))
    return inodes


def descendants(pids: set[int]) -> set[int]:
    """`pids` and every process below them (bounded by the process table's size)."""
    parents: dict[int, int] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            with contextlib.suppress(OSError, IndexError, ValueError):
                stat = Path(f"/proc/{entry}/stat").read_text()
                parents[int(entry)] = int(stat.rsplit(")", 1)[1].split()[1])
    found = set(pids)
    for _ in range(len(parents)):
        more = {p for p, parent in parents.items() if parent in found} - found
        if not more:
            break
        found |= more
    return found


def listeners_of(pids: set[int]) -> list[tuple[str, int]]:
    """(address, port) of each socket that one of `pids` (not their children) holds in LISTEN."""
    table = _listening()
    inodes: set[int] = set()
    for pid in pids:
        inodes |= _socket_inodes(pid)
    return sorted(table[i] for i in inodes if i in table)


def beyond_loopback(listeners: list[tuple[str, int]]) -> list[tuple[str, int]]:
    """Those not on a loopback address (0.0.0.0 and :: are every interface: not loopback)."""
    out = []
    for host, port in listeners:
        address = ipaddress.ip_address(host)
        mapped = address.ipv4_mapped if isinstance(address, ipaddress.IPv6Address) else None
        if not (mapped or address).is_loopback:
            out.append((host, port))
    return out


def other_interface() -> str | None:
    """A network interface of this host with an IPv4 address beyond loopback, if it has one: set as
    GLOO_SOCKET_IFNAME around a local run, it stands for a host whose name resolves to a LAN address."""
    import fcntl

    for _, name in socket.if_nameindex():
        with contextlib.suppress(OSError), socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            request = struct.pack("256s", name.encode()[:15])
            address = socket.inet_ntoa(fcntl.ioctl(s.fileno(), 0x8915, request)[20:24])  # SIOCGIFADDR
            if not ipaddress.ip_address(address).is_loopback:
                return name
    return None
