"""What needs no namespaces: the reason hosts cannot be made, command failures, and the flapping
timer driven by plain functions, the relay's queue (so these run, and guard, where the rest of tests/hosts
skips)."""

from __future__ import annotations

import socket
import threading
import time

import pytest

from ddiloco.hosts import Flapper, HostsUnavailable, Network, commands, relay, unavailable_reason


def test_not_root_is_the_reason_and_nothing_is_made(monkeypatch):
    monkeypatch.setattr(commands.os, "geteuid", lambda: 1000)
    assert unavailable_reason() == "network namespaces need root (effective uid is 1000)"
    with pytest.raises(HostsUnavailable, match="need root"):
        Network(["a"])


def test_a_missing_ip_is_the_reason(monkeypatch):
    monkeypatch.setattr(commands.os, "geteuid", lambda: 0)
    monkeypatch.setattr(commands.shutil, "which", lambda tool: None if tool == "ip" else "/usr/bin/" + tool)
    assert unavailable_reason() == "`ip` (iproute2) is not installed"
    with pytest.raises(HostsUnavailable, match="iproute2"):
        commands.require_hosts()


def test_a_failed_command_says_what_and_why():
    with pytest.raises(commands.CommandFailed) as failed:
        commands.run(["sh", "-c", "echo nope >&2; exit 3"])
    assert failed.value.returncode == 3 and "nope" in failed.value.stderr and "exited 3" in str(failed.value)
    assert commands.run(["sh", "-c", "exit 3"], check=False).returncode == 3


def test_a_command_that_hangs_is_ended(monkeypatch):
    monkeypatch.setattr(commands, "COMMAND_TIMEOUT_S", 0.2)
    with pytest.raises(commands.CommandFailed, match="no answer"):
        commands.run(["sleep", "30"])


def test_a_flapper_cuts_count_times_and_always_ends_healed():
    events: list[str] = []
    flapper = Flapper(lambda: events.append("cut"), lambda: events.append("heal"), period=0.02, count=3).start()
    assert flapper.join(timeout=60)
    flapper.stop()
    assert events[:6] == ["cut", "heal"] * 3 and events[-1] == "heal" and flapper.cuts == 3


def test_a_flapper_stopped_early_heals_and_raises_what_failed():
    cut_once = threading.Event()

    def cut() -> None:
        cut_once.set()
        raise OSError("the link is gone")

    healed: list[bool] = []
    flapper = Flapper(cut, lambda: healed.append(True), period=0.2, count=5, up=0.01)
    with pytest.raises(OSError, match="gone"), flapper:
        assert cut_once.wait(60)
        assert flapper.join(timeout=60)
    assert healed and not flapper.running


@pytest.mark.parametrize(("period", "count", "up"), [(0, 1, None), (1.0, 0, None), (1.0, 1, 1.0), (1.0, 10**6, None)])
def test_bad_flapping_is_refused(period, count, up):
    with pytest.raises(ValueError):
        Flapper(lambda: None, lambda: None, period, count, up)


def _ipv4_to(dst: str) -> bytes:
    return bytes([0x45]) + bytes(15) + socket.inet_aton(dst) + b"payload"


def test_the_relay_holds_each_packet_its_delay_keeps_order_and_drops_its_loss():
    table = relay.parse_table(
        '{"198.18.0.2": ["02:dd:00:00:00:02", 0.05, 0.04, 0.0], "198.18.0.3": ["02:dd:00:00:00:03", 0.0, 0.0, 1.0]}'
    )
    r = relay.Relay(-1, socket.socket(), b"\x02\xdd\x00\x00\x00\x01", table)
    start = time.monotonic()
    for _ in range(50):
        r.take(_ipv4_to("198.18.0.2"))
    r.take(_ipv4_to("198.18.0.3"))  # loss 100 %
    r.take(_ipv4_to("198.18.0.9"))  # not a host of the network
    r.take(b"\x60" + bytes(40))  # not IPv4
    assert len(r.held) == 50 and r.dropped == 2
    releases = [release for release, seq, _, _ in sorted(r.held, key=lambda h: h[1])]
    assert releases == sorted(releases)  # jitter never reorders packets to one destination
    assert all(release >= start for release in releases) and max(releases) > start
    assert all(mac == bytes.fromhex("02dd00000002") for _, _, mac, _ in r.held)
