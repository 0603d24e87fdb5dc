"""The wiring of a network of hosts: a bridge in a namespace of its own, and per host a namespace
with a veth pair to the bridge, its address and MAC, and fixed neighbours. Only `ip -n NAMESPACE`
calls on namespaces the network made: nothing is created in the root namespace."""

from __future__ import annotations

import ipaddress
from collections.abc import Callable
from dataclasses import dataclass

from .commands import ip
from .shaping import LinkSpec

SUBNET = ipaddress.IPv4Network("198.18.0.0/15")  # RFC 2544: reserved for network benchmarks
HOST_DEV = "eth0"  # the host's end of its link, inside the host's namespace
BRIDGE = "br0"  # inside the bridge's namespace


@dataclass
class Host:
    """One host: its name, namespace, address, and the state of its link (`cut_out`: what it sends
    is dropped; `cut_in`: what is sent to it is dropped)."""

    name: str
    index: int
    netns: str
    address: str
    mac: str
    port: str  # the bridge's end of the host's link, in the bridge's namespace
    link: LinkSpec
    cut_out: bool = False
    cut_in: bool = False
    dropped_out: int = 0  # drops counted by qdiscs since replaced (the kernel restarts at zero)
    dropped_in: int = 0


def make_bridge(netns: str) -> None:
    ip("link", "add", BRIDGE, "type", "bridge", netns=netns)
    ip("link", "set", BRIDGE, "addrgenmode", "none", "up", netns=netns)


def make_host(
    prefix: str, index: int, name: str, link: LinkSpec, bridge_netns: str, add_netns: Callable[[str], None]
) -> Host:
    """Host number `index`: its namespace (made through `add_netns`, which records it), a veth pair
    from the bridge into it, address number index + 1 of SUBNET, and a fixed locally administered MAC."""
    n = index + 1
    host = Host(
        name=name,
        index=index,
        netns=f"{prefix}-h{index}",
        address=str(SUBNET[n]),
        mac="02:dd:00:{:02x}:{:02x}:{:02x}".format(*n.to_bytes(3, "big")),
        port=f"p{index}",
        link=link,
    )
    add_netns(host.netns)
    veth = ["type", "veth", "peer", "name", HOST_DEV, "netns", host.netns]
    ip("link", "add", host.port, *veth, netns=bridge_netns)
    # addrgenmode none: no IPv6 link-local address, so no chatter the counters would count
    ip("link", "set", host.port, "addrgenmode", "none", "master", BRIDGE, "up", netns=bridge_netns)
    ip("link", "set", HOST_DEV, "address", host.mac, "addrgenmode", "none", netns=host.netns)
    ip("addr", "add", f"{host.address}/{SUBNET.prefixlen}", "dev", HOST_DEV, netns=host.netns)
    ip("link", "set", HOST_DEV, "up", netns=host.netns)
    return host


def fix_neighbours(hosts: list[Host]) -> None:
    """Every host knows every other's MAC for good: no ARP, so a link cut one way stays cut one way
    only (ARP replies would be cut too, and the link would fail both ways once the cache expired)."""
    for host in hosts:
        for peer in hosts:
            if peer is not host:
                entry = [peer.address, "lladdr", peer.mac, "dev", HOST_DEV, "nud", "permanent"]
                ip("neigh", "replace", *entry, netns=host.netns)
