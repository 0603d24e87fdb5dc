"""Latency, jitter and loss on a kernel without netem: a relay process (relay.py) in every host, and
routes that send the host's packets for the other hosts through it.

A host's link latency is added in each direction of that link, so a packet from a to b is held for
latency(a) + latency(b) by a's relay (jitter: the root of the summed squares; loss: either link's).
Every host gets a relay once any link needs one, because a host whose own link is fast must still
delay what it sends to a slow one. Routes to 198.18.0.0/16 and 198.19.0.0/16 through the relay's TUN
device beat the /15 that `eth0`'s address gives, and go with the device when the relay ends.
"""

from __future__ import annotations

import json
import math
import select
import subprocess
import sys
from collections.abc import Callable, Mapping
from typing import Any, Protocol

from .commands import CommandFailed, ip
from .shaping import LinkSpec

TUN = "dly0"
READY_TIMEOUT_S = 60.0  # a Python start on a loaded machine


class _Host(Protocol):
    name: str
    netns: str
    address: str
    mac: str
    link: LinkSpec


def table_for(me: _Host, hosts: Mapping[str, _Host]) -> dict[str, list[Any]]:
    """What `me`'s relay does with a packet for each other host: [mac, delay, jitter, loss]."""
    out: dict[str, list[Any]] = {}
    for peer in hosts.values():
        if peer is me:
            continue
        a, b = me.link, peer.link
        out[peer.address] = [
            peer.mac,
            a.latency_s + b.latency_s,
            math.hypot(a.jitter_s, b.jitter_s),
            1 - (1 - a.loss) * (1 - b.loss),
        ]
    return out


def start_relay(
    host: _Host, hosts: Mapping[str, _Host], popen: Callable[..., subprocess.Popen[Any]], dev: str
) -> subprocess.Popen[Any]:
    """Start `host`'s relay, wait until its TUN device exists, and route the other hosts through it."""
    table = json.dumps(table_for(host, hosts))
    argv = [sys.executable, "-m", "ddiloco.hosts.relay", TUN, dev, host.mac, table]
    proc = popen(host.name, argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    _expect(proc, "ready", f"the delay relay in host {host.name} did not start")
    ip("link", "set", TUN, "addrgenmode", "none", "txqueuelen", "1000", "up", netns=host.netns)
    for half in ("198.18.0.0/16", "198.19.0.0/16"):
        ip("route", "replace", half, "dev", TUN, "src", host.address, netns=host.netns)
    return proc


def update_relay(proc: subprocess.Popen[Any], host: _Host, hosts: Mapping[str, _Host]) -> None:
    """Give a running relay its new table (one JSON line on its stdin) and wait until it is in force."""
    assert proc.stdin is not None and proc.stdout is not None
    proc.stdin.write(json.dumps(table_for(host, hosts)) + "\n")
    proc.stdin.flush()
    _expect(proc, "ok", f"the delay relay in host {host.name} did not take its new table")


def _expect(proc: subprocess.Popen[Any], word: str, failure: str) -> None:
    assert proc.stdout is not None
    ready, _, _ = select.select([proc.stdout], [], [], READY_TIMEOUT_S)
    if not ready or proc.stdout.readline().strip() != word:
        raise CommandFailed(["python", "-m", "ddiloco.hosts.relay"], proc.poll() or -1, failure)
