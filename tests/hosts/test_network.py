"""Hosts reach each other at their own addresses, the root namespace does not reach them, and
teardown leaves nothing behind: no namespace with the network's prefix, no process it started."""

from __future__ import annotations

import ipaddress
import json
import subprocess
import sys

import pytest

from ddiloco.hosts import SUBNET, Network
from ddiloco.hosts.commands import netns_names

from .peering import PEERS, Peer, alive


def test_two_hosts_talk_over_tcp_at_their_own_addresses(make_network):
    net = make_network(["a", "b"])
    assert ipaddress.ip_address(net.address("a")) in SUBNET and net.address("a") != net.address("b")
    assert all(n.startswith(net.prefix + "-") for n in net.namespaces) and net.bridge_netns in net.namespaces
    server = Peer(net, "a", "serve", net.address("a"), 9000, 120)
    assert server.line()["ready"]
    client = Peer(net, "b", "send", net.address("a"), 9000, 100_000, 30)
    assert client.line()["ok"]


def test_the_root_namespace_has_no_address_and_no_route_on_the_network(make_network):
    net = make_network(["a", "b"])
    addrs = json.loads(subprocess.run(["ip", "-j", "-4", "addr"], capture_output=True, text=True, check=True).stdout)
    mine = [a["local"] for link in addrs for a in link.get("addr_info", [])]
    assert not [a for a in mine if ipaddress.ip_address(a) in SUBNET], mine
    routes = json.loads(
        subprocess.run(
            ["ip", "-j", "-4", "route", "show", "table", "all"], capture_output=True, text=True, check=True
        ).stdout
    )
    on_net = [r for r in routes if r["dst"] not in ("default",) and _overlaps(r["dst"])]
    assert not on_net, on_net
    links = json.loads(subprocess.run(["ip", "-j", "link"], capture_output=True, text=True, check=True).stdout)
    assert not [x["ifname"] for x in links if x["ifname"].startswith(("p0", "p1", "br0"))]
    # and so a server on host a is not reached from here (the root namespace's default route, if it
    # has one, leads elsewhere: whatever answers there, it is not host a)
    server = Peer(net, "a", "serve", net.address("a"), 9001, 120)
    assert server.line()["ready"]
    from_root = subprocess.run(
        [sys.executable, PEERS, "send", net.address("a"), "9001", "10", "3"], capture_output=True, text=True, timeout=60
    )
    assert json.loads(from_root.stdout)["ok"] is False
    client = Peer(net, "b", "send", net.address("a"), 9001, 10, 30)  # while host b can
    assert client.line()["ok"]
    assert server.line() == {"accepted": net.address("b")}  # the first and only connection host a saw


def _overlaps(dst: str) -> bool:
    return ipaddress.ip_network(dst if "/" in dst else dst + "/32", strict=False).overlaps(SUBNET)


def test_teardown_stops_our_processes_and_their_children_and_removes_our_namespaces(make_network):
    net = make_network(["a", "b", "c"])
    spawner = (
        "import subprocess, time; c = subprocess.Popen(['sleep', '300']); print(c.pid, flush=True); time.sleep(300)"
    )
    parent = net.popen("b", [sys.executable, "-c", spawner], stdout=subprocess.PIPE, text=True)
    assert parent.stdout is not None
    child = int(parent.stdout.readline())
    # a process that ignores SIGTERM is killed after the grace period
    stubborn = net.popen(
        "c",
        [
            sys.executable,
            "-c",
            "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); print(1, flush=True); time.sleep(300)",
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    assert stubborn.stdout is not None and stubborn.stdout.readline()
    net.grace = 1.0
    pids = [parent.pid, child, stubborn.pid, *net.processes.pids]
    assert all(alive(p) for p in pids)
    net.close()
    assert not [p for p in pids if alive(p)]
    assert not [n for n in netns_names() if n.startswith(net.prefix)]
    net.close()  # idempotent
    with pytest.raises(RuntimeError, match="closed"):
        net.popen("a", ["true"])


def test_a_with_block_tears_down_and_prefixes_are_unique(make_network):
    make_network(["x"])  # skips where hosts cannot be made
    with Network(["a"]) as one, Network(["a"]) as two:
        assert one.prefix != two.prefix and one.address("a") == two.address("a")  # separate networks
        names = set(one.namespaces + two.namespaces)
        assert names <= netns_names()
    assert not names & netns_names()


def test_bad_host_names_are_refused_before_anything_is_made(make_network):
    make_network(["x"])
    before = netns_names()
    for names in ([], ["a", "a"], ["a b"], ["../x"]):
        with pytest.raises(ValueError):
            Network(names)
    assert netns_names() == before
