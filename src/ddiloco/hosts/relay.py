"""The packet-level delay stage for kernels without netem: a process inside one host that owns a TUN
device, which the host's routes to the other hosts point at. It reads each IP packet the host sends,
holds it for the link's delay (plus jitter, per destination, first in first out), drops it with the
link's loss, and then writes it onto the host's `eth0` as an Ethernet frame to the destination's MAC.
TCP ends in the hosts, never here: it sees the real round trip and the bandwidth-delay product, and
the `tbf` on `eth0` still shapes what leaves.

Run as `python -m ddiloco.hosts.relay TUN DEV SRC_MAC TABLE_JSON` by the network. The table maps a
destination address to [mac, delay_s, jitter_s, loss]; a JSON line on stdin replaces it. It says
`ready` once the TUN device exists and `ok` after each new table, and ends when stdin closes or on SIGTERM.
"""

from __future__ import annotations

import fcntl
import heapq
import json
import os
import random
import socket
import struct
import sys
import threading
import time

TUNSETIFF = 0x400454CA
IFF_TUN, IFF_NO_PI = 0x0001, 0x1000
ETH_P_IP = 0x0800
MAX_HELD = 10_000  # packets held at once; beyond it a packet is dropped, like a full netem queue
Table = dict[str, tuple[bytes, float, float, float]]


def open_tun(name: str) -> int:
    fd = os.open("/dev/net/tun", os.O_RDWR)
    fcntl.ioctl(fd, TUNSETIFF, struct.pack("16sH", name.encode(), IFF_TUN | IFF_NO_PI))
    return fd


def parse_table(text: str) -> Table:
    return {
        ip: (bytes.fromhex(mac.replace(":", "")), float(d), float(j), float(p))
        for ip, (mac, d, j, p) in json.loads(text).items()
    }


class Relay:
    """Packets in from the TUN fd, out to the packet socket once their time comes."""

    def __init__(self, tun_fd: int, out: socket.socket, src_mac: bytes, table: Table) -> None:
        self.tun_fd, self.out, self.src_mac, self.table = tun_fd, out, src_mac, table
        self.held: list[tuple[float, int, bytes, bytes]] = []  # (release, seq, dst mac, packet)
        self.last: dict[str, float] = {}  # per destination: the latest release, so no reordering
        self.cond = threading.Condition()
        self.seq = 0
        self.dropped = 0

    def take(self, packet: bytes) -> None:
        if len(packet) < 20 or packet[0] >> 4 != 4:
            return  # IPv4 only: the network has no other
        dst = socket.inet_ntoa(packet[16:20])
        entry = self.table.get(dst)
        if entry is None or (entry[3] and random.random() < entry[3]):
            self.dropped += 1
            return
        mac, delay, jitter, _ = entry
        now = time.monotonic()
        release = max(now + max(0.0, random.gauss(delay, jitter) if jitter else delay), self.last.get(dst, 0.0))
        self.last[dst] = release
        with self.cond:
            if len(self.held) >= MAX_HELD:
                self.dropped += 1
                return
            self.seq += 1
            heapq.heappush(self.held, (release, self.seq, mac, packet))
            self.cond.notify()

    def read_loop(self) -> None:
        while True:
            self.take(os.read(self.tun_fd, 65536))

    def send_loop(self) -> None:
        header = struct.pack("!H", ETH_P_IP)
        while True:
            with self.cond:
                while not self.held or self.held[0][0] > time.monotonic():
                    self.cond.wait(None if not self.held else self.held[0][0] - time.monotonic())
                _, _, mac, packet = heapq.heappop(self.held)
            try:
                self.out.send(mac + self.src_mac + header + packet)
            except OSError:  # the qdisc's queue is full (ENOBUFS): a drop, as on a real link
                self.dropped += 1


def main(argv: list[str]) -> None:
    tun, dev, src_mac, table = argv
    fd = open_tun(tun)
    out = socket.socket(socket.AF_PACKET, socket.SOCK_RAW)
    out.bind((dev, 0))
    relay = Relay(fd, out, bytes.fromhex(src_mac.replace(":", "")), parse_table(table))
    for loop in (relay.read_loop, relay.send_loop):
        threading.Thread(target=loop, daemon=True).start()
    print("ready", flush=True)
    for line in sys.stdin:  # a new table per line; stdin closed: the network is gone, so are we
        relay.table = parse_table(line)
        print("ok", flush=True)  # the network waits for this: a change is in force once shape() returns


if __name__ == "__main__":
    main(sys.argv[1:])
