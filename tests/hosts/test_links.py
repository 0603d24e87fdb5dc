"""Links shaped and cut by the kernel: a rate is a lower bound on transfer time, a partition stalls
a connection and a heal resumes it, a one-way cut drops one direction only, a flapping link flaps a
bounded number of times and ends healed. Only lower bounds on time are asserted, never upper ones."""

from __future__ import annotations

import pytest

from ddiloco.hosts import LinkSpec, NetemUnavailable
from ddiloco.hosts.commands import json_of, tc

from .peering import Peer

RATE = "8mbit"


def test_a_transfer_takes_at_least_its_size_over_the_rate(make_network):
    net = make_network(["a", "b"], links={"b": f"rate={RATE}"})  # a unshaped: b's link alone bounds it
    spec = net["b"].link
    assert spec.rate_bps is not None
    n = 1_500_000
    server = Peer(net, "a", "serve", net.address("a"), 9000, 300)
    assert server.line()["ready"]
    result = Peer(net, "b", "send", net.address("a"), 9000, n, 240).line(timeout=300)
    assert result["ok"]
    assert result["elapsed"] >= (n - spec.burst_bytes) * 8 / spec.rate_bps  # ~1.5 s; unshaped, milliseconds
    kinds = {q["kind"] for q in json_of(tc("-j", "qdisc", "show", "dev", "eth0", netns=net["b"].netns))}
    assert kinds == {"tbf"}
    assert "tbf" not in {q["kind"] for q in json_of(tc("-j", "qdisc", "show", "dev", "eth0", netns=net["a"].netns))}
    net.shape("b", None)  # unshaped again: the device's own qdisc
    kinds = {q["kind"] for q in json_of(tc("-j", "qdisc", "show", "dev", "eth0", netns=net["b"].netns))}
    assert "tbf" not in kinds


def test_a_partition_stalls_a_connection_and_a_heal_resumes_it(make_network):
    net = make_network(["a", "b"])
    server = Peer(net, "a", "serve", net.address("a"), 9000, 300)
    assert server.line()["ready"]
    held = Peer(net, "b", "hold", net.address("a"), 9000, 2, 120)
    assert held.line() == {"phase": "connected", "replied": True}
    net.partition("b")
    held.tell()  # a round sent into the partition: no reply within its wait
    assert held.line(timeout=120) == {"phase": "cut", "replied": False}
    # a new connection cannot even be made: it times out, as a dead link does (not refused)
    assert Peer(net, "b", "send", net.address("a"), 9000, 10, 2).line(timeout=120) == {"ok": False, "error": "timeout"}
    assert Peer(net, "a", "send", net.address("b"), 9000, 10, 2).line(timeout=120) == {"ok": False, "error": "timeout"}
    net.heal("b")
    held.tell()  # the same connection carries the round once healed (TCP retransmits it)
    assert held.line(timeout=150) == {"phase": "healed", "replied": True}
    assert Peer(net, "b", "send", net.address("a"), 9000, 10, 30).line(timeout=120)["ok"]


def test_a_one_way_cut_drops_one_direction_only(make_network):
    net = make_network(["a", "b"])
    net.cut("b", "out")  # what b sends is dropped; what is sent to b arrives
    at_a = Peer(net, "a", "udp-recv", net.address("a"), 9100, 300)
    at_b = Peer(net, "b", "udp-recv", net.address("b"), 9100, 300)
    assert at_a.line()["ready"] and at_b.line()["ready"]
    before = net.counters("b")
    assert Peer(net, "b", "udp-send", net.address("a"), 9100, 20, "cut").line(timeout=120) == {"sent": 20}
    assert Peer(net, "a", "udp-send", net.address("b"), 9100, 20, "open").line(timeout=120) == {"sent": 20}
    assert at_b.line(timeout=120) == {"got": "open", "peer": net.address("a")}
    after = net.counters("b")
    assert after["sent_dropped"] - before["sent_dropped"] >= 20  # b's datagrams: dropped on b's link
    assert after["received_dropped"] == before["received_dropped"]
    net.heal("b")
    assert Peer(net, "b", "udp-send", net.address("a"), 9100, 1, "healed").line(timeout=120) == {"sent": 1}
    # the first datagram at a is the one sent after the heal: none of the 20 sent before it came through
    assert at_a.line(timeout=120) == {"got": "healed", "peer": net.address("b")}
    assert net.counters("b")["sent_dropped"] == after["sent_dropped"]


def test_a_one_way_cut_inward_blocks_what_b_receives(make_network):
    net = make_network(["a", "b"])
    net.cut("b", "in")
    at_a = Peer(net, "a", "udp-recv", net.address("a"), 9100, 300)
    assert at_a.line()["ready"]
    before = net.counters("b")
    assert Peer(net, "a", "udp-send", net.address("b"), 9100, 5, "cut").line(timeout=120) == {"sent": 5}
    assert net.counters("b")["received_dropped"] - before["received_dropped"] >= 5
    assert Peer(net, "b", "udp-send", net.address("a"), 9100, 1, "open").line(timeout=120) == {"sent": 1}
    assert at_a.line(timeout=120) == {"got": "open", "peer": net.address("b")}


def test_a_flapping_link_flaps_count_times_and_ends_healed(make_network):
    net = make_network(["a", "b"], f"rate={RATE}")
    flapper = net.flap("b", period=0.4, count=3)
    assert flapper.join(timeout=120)
    flapper.stop()
    assert flapper.cuts == 3 and not net["b"].cut_in and not net["b"].cut_out
    kinds = {q["kind"] for q in json_of(tc("-j", "qdisc", "show", "dev", "eth0", netns=net["b"].netns))}
    assert kinds == {"tbf"}  # back to its shaping, not left cut
    long = net.flap("b", period=60.0, count=100, up=0.01)
    long.stop()  # stopped early (cut or not yet), it heals
    assert long.cuts <= 1 and not net["b"].cut_out and not long.running
    server = Peer(net, "a", "serve", net.address("a"), 9000, 300)
    assert server.line()["ready"]
    assert Peer(net, "b", "send", net.address("a"), 9000, 10, 30).line(timeout=120)["ok"]
    with pytest.raises(ValueError):
        net.flap("b", period=1.0, count=0)


def test_latency_is_a_lower_bound_on_the_round_trip(make_network):
    net = make_network(["a", "b"], links={"a": "latency=20ms", "b": "latency=30ms,rate=50mbit"})
    server = Peer(net, "a", "serve", net.address("a"), 9000, 300)
    assert server.line()["ready"]
    rtts = Peer(net, "b", "rtt", net.address("a"), 9000, 5).line(timeout=120)["rtts"]
    assert len(rtts) == 5 and min(rtts) >= 2 * (0.020 + 0.030)  # each way crosses both links
    net.shape("b", "latency=100ms")
    rtts = Peer(net, "b", "rtt", net.address("a"), 9000, 3).line(timeout=120)["rtts"]
    assert len(rtts) == 3 and min(rtts) >= 2 * (0.020 + 0.100)
    # a large transfer still arrives whole through the delay (and the bound holds for it too)
    result = Peer(net, "b", "send", net.address("a"), 9000, 2_000_000, 120).line(timeout=300)
    assert result["ok"] and result["elapsed"] >= 2 * (0.020 + 0.100)


def test_loss_drops_packets_on_the_way(make_network):
    net = make_network(["a", "b"], links={"b": "loss=100%"})
    at_a = Peer(net, "a", "udp-recv", net.address("a"), 9100, 300)
    at_b = Peer(net, "b", "udp-recv", net.address("b"), 9100, 300)
    assert at_a.line()["ready"] and at_b.line()["ready"]
    assert Peer(net, "b", "udp-send", net.address("a"), 9100, 10, "lost").line(timeout=120) == {"sent": 10}
    assert Peer(net, "a", "udp-send", net.address("b"), 9100, 10, "lost").line(timeout=120) == {"sent": 10}
    net.shape("b", None)
    assert Peer(net, "b", "udp-send", net.address("a"), 9100, 1, "after").line(timeout=120) == {"sent": 1}
    assert Peer(net, "a", "udp-send", net.address("b"), 9100, 1, "after").line(timeout=120) == {"sent": 1}
    # the first datagram each side sees is one sent after the loss was lifted
    assert at_a.line(timeout=120) == {"got": "after", "peer": net.address("b")}
    assert at_b.line(timeout=120) == {"got": "after", "peer": net.address("a")}


def test_netem_asked_for_by_name_where_the_kernel_has_none_says_so(make_network):
    net = make_network(["a"], delay="netem")
    if net.has_netem():
        pytest.skip("this kernel has netem: latency is made, not refused")
    with pytest.raises(NetemUnavailable, match="netem"):
        net.shape("a", "latency=80ms")
    with pytest.raises(NetemUnavailable, match="netem"):
        make_network(["b", "c"], links={"c": LinkSpec(rate_bps=10**6, loss=0.01)}, delay="netem")
    with pytest.raises(ValueError, match="not in the network"):
        make_network(["b"], links={"c": "rate=1mbit"})
    assert net["a"].link == LinkSpec()  # nothing changed
