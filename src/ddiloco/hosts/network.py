"""A network of hosts on this machine: one network namespace per host, joined by a bridge that lives
in a namespace of its own, each host with its own address in 198.18.0.0/15 (the range reserved for
network benchmarks). Nothing is made in the root namespace: it gets no address on this network and
no route to it, so nothing a host sends can leave the machine.

Every namespace carries the network's unique prefix (`ddl-<6 hex>-`), and teardown removes exactly
the names it made and stops exactly the processes it started (by PID), from `close()`, `with` or
`atexit`, as often as it is called.
"""

from __future__ import annotations

import atexit
import contextlib
import re
import secrets
import subprocess
import threading
from collections.abc import Mapping, Sequence
from typing import Any, Literal

from .commands import CommandFailed, HostsUnavailable, NetemUnavailable, ip, netns_names, require_hosts
from .delays import start_relay, update_relay
from .faults import Flapper
from .processes import ProcessGroups
from .shaping import LinkSpec, apply, device_bytes, netem_available, netem_missing, qdisc_drops
from .topology import HOST_DEV, SUBNET, Host, fix_neighbours, make_bridge, make_host

NAME_RE = re.compile(r"[A-Za-z0-9_.-]{1,64}")
Direction = Literal["in", "out", "both"]
DelayMode = Literal["auto", "netem", "relay"]


def _as_spec(link: LinkSpec | str | None) -> LinkSpec:
    return link if isinstance(link, LinkSpec) else LinkSpec.parse(link or "")


class Network:
    """Hosts named `names`, each behind a link `link` (a LinkSpec or "rate=100mbit,..."; None: unshaped),
    or its own from `links` (host name -> link)."""

    def __init__(
        self,
        names: Sequence[str],
        link: LinkSpec | str | None = None,
        links: Mapping[str, LinkSpec | str | None] | None = None,
        grace: float = 5.0,
        delay: DelayMode = "auto",
    ) -> None:
        require_hosts()
        if delay not in ("auto", "netem", "relay"):
            raise ValueError(f"delay {delay!r}: auto, netem or relay")
        names = list(names)
        if not names or len(set(names)) != len(names) or not all(NAME_RE.fullmatch(n) for n in names):
            raise ValueError(f"host names must be distinct, non-empty and [A-Za-z0-9_.-]: {names}")
        if len(names) > SUBNET.num_addresses - 2:
            raise ValueError(f"{len(names)} hosts do not fit in {SUBNET}")
        unknown = set(links or {}) - set(names)
        if unknown:
            raise ValueError(f"links for hosts not in the network: {sorted(unknown)}")
        specs = {n: _as_spec((links or {}).get(n, link)) for n in names}
        self.grace = grace
        self.processes = ProcessGroups()
        self._lock = threading.RLock()
        self._namespaces: list[str] = []  # made by us, in order: only these are ever deleted
        self._flappers: list[Flapper] = []
        self._netem: bool | None = None
        self.delay = delay
        self._relays: dict[str, subprocess.Popen[Any]] = {}
        self.closed = False
        existing = netns_names()
        self.prefix = next(p for p in (f"ddl-{secrets.token_hex(3)}" for _ in range(100)) if not _taken(p, existing))
        self.bridge_netns = f"{self.prefix}-br"
        self.hosts: dict[str, Host] = {}
        atexit.register(self.close)
        try:
            self._build(specs)
        except BaseException:
            self.close()
            raise

    # --- building -------------------------------------------------------------------------------
    def _add_netns(self, name: str) -> None:
        done = ip("netns", "add", name, check=False)
        if done.returncode != 0:
            raise HostsUnavailable(f"cannot make network namespace {name}: {done.stderr.strip()}")
        self._namespaces.append(name)
        ip("link", "set", "lo", "up", netns=name)

    def _build(self, specs: dict[str, LinkSpec]) -> None:
        self._add_netns(self.bridge_netns)  # first: has_netem() tries netem there
        for spec in specs.values():
            self._check_delay(spec)
        make_bridge(self.bridge_netns)
        for i, (name, spec) in enumerate(specs.items()):
            self.hosts[name] = make_host(self.prefix, i, name, spec, self.bridge_netns, self._add_netns)
        fix_neighbours(list(self.hosts.values()))
        if any(spec.needs_netem for spec in specs.values()) and self._relayed:
            self._start_relays()
        for host in self.hosts.values():
            self._apply(host)

    # --- looking up -----------------------------------------------------------------------------
    def __getitem__(self, name: str) -> Host:
        return self.hosts[name]

    def address(self, name: str) -> str:
        return self.hosts[name].address

    @property
    def namespaces(self) -> list[str]:
        """Every namespace this network made and has not removed yet."""
        return list(self._namespaces)

    @property
    def _relayed(self) -> bool:
        """Whether latency, jitter and loss are made by relays (else by netem)."""
        return self.delay == "relay" or self.delay == "auto" and not self.has_netem()

    def _check_delay(self, spec: LinkSpec) -> None:
        if spec.needs_netem and self.delay == "netem" and not self.has_netem():
            raise NetemUnavailable(netem_missing(spec))

    def _start_relays(self) -> None:
        for host in self.hosts.values():
            if host.name not in self._relays:
                self._relays[host.name] = start_relay(host, self.hosts, self.popen, HOST_DEV)

    def has_netem(self) -> bool:
        """Whether this kernel has netem (tried once, in the bridge's namespace)."""
        if self._netem is None:
            if self.bridge_netns not in self._namespaces:
                raise RuntimeError("the network is closed")
            self._netem = netem_available(self.bridge_netns)
        return self._netem

    # --- processes ------------------------------------------------------------------------------
    def command(self, name: str, argv: Sequence[str]) -> list[str]:
        """The argument list that runs `argv` inside host `name` (`ip netns exec NS ...`)."""
        return ["ip", "netns", "exec", self.hosts[name].netns, *argv]

    def popen(self, name: str, argv: Sequence[str], **popen_kwargs: Any) -> subprocess.Popen[Any]:
        """Start `argv` inside host `name`; the network stops it (and its process group) on close."""
        if self.closed:
            raise RuntimeError("the network is closed")
        return self.processes.start(self.command(name, argv), **popen_kwargs)

    # --- links and faults -----------------------------------------------------------------------
    def _apply(self, host: Host) -> None:
        with self._lock:
            host.dropped_out += qdisc_drops(host.netns, HOST_DEV)
            host.dropped_in += qdisc_drops(self.bridge_netns, host.port)
            spec = LinkSpec(rate_bps=host.link.rate_bps) if self._relayed else host.link  # the rest: relays
            apply(host.netns, HOST_DEV, spec, host.cut_out)
            apply(self.bridge_netns, host.port, spec, host.cut_in)

    def shape(self, name: str, link: LinkSpec | str | None) -> None:
        """Give host `name` a new link (both directions); a cut stays cut until healed."""
        spec = _as_spec(link)
        self._check_delay(spec)
        host = self.hosts[name]
        with self._lock:
            host.link = spec
            self._apply(host)
            if self._relayed and spec.needs_netem:
                self._start_relays()
            for other, proc in self._relays.items():  # every pair with this host changed
                update_relay(proc, self.hosts[other], self.hosts)

    def cut(self, name: str, direction: Direction = "both") -> None:
        """Drop, in silence, what host `name` sends ("out"), receives ("in") or both (a partition)."""
        if direction not in ("in", "out", "both"):
            raise ValueError(f"direction {direction!r}: in, out or both")
        host = self.hosts[name]
        with self._lock:
            host.cut_out = host.cut_out or direction in ("out", "both")
            host.cut_in = host.cut_in or direction in ("in", "both")
            self._apply(host)

    def partition(self, name: str) -> None:
        """Cut host `name` off from every other host, both directions."""
        self.cut(name, "both")

    def heal(self, name: str) -> None:
        """Undo every cut of host `name`'s link; its shaping stays."""
        host = self.hosts[name]
        with self._lock:
            host.cut_out = host.cut_in = False
            self._apply(host)

    def flap(self, name: str, period: float, count: int, up: float | None = None) -> Flapper:
        """Partition and heal host `name` `count` times, every `period` s (healed `up` s of each)."""
        self.hosts[name]  # an unknown name fails here, not in the thread
        flapper = Flapper(lambda: self.partition(name), lambda: self.heal(name), period, count, up)
        self._flappers.append(flapper)
        return flapper.start()

    def counters(self, name: str) -> dict[str, int]:
        """What host `name`'s link carried since it was made: bytes each way, and the packets dropped
        each way by its qdiscs (cuts, and tbf queues that overflowed)."""
        host = self.hosts[name]
        with self._lock:
            sent, received = device_bytes(host.netns, HOST_DEV)
            return {
                "sent_bytes": sent,
                "received_bytes": received,
                "sent_dropped": host.dropped_out + qdisc_drops(host.netns, HOST_DEV),
                "received_dropped": host.dropped_in + qdisc_drops(self.bridge_netns, host.port),
            }

    # --- teardown -------------------------------------------------------------------------------
    def close(self) -> None:
        """Stop the flappers, then our processes (by PID), then delete our namespaces (by exact name)."""
        with self._lock:
            if self.closed and not self._namespaces:
                return
            self.closed = True
        for flapper in self._flappers:
            with contextlib.suppress(Exception):  # a flap that failed: the namespaces go anyway
                flapper.stop(timeout=10.0)
        self.processes.stop_all(self.grace)
        for name in list(reversed(self._namespaces)):
            done = ip("netns", "del", name, check=False)
            if done.returncode == 0 or name not in netns_names():
                self._namespaces.remove(name)
        atexit.unregister(self.close)
        if self._namespaces:
            raise CommandFailed(["ip", "netns", "del", *self._namespaces], 1, "namespaces left behind")

    def __enter__(self) -> Network:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _taken(prefix: str, existing: set[str]) -> bool:
    return any(name.startswith(prefix) for name in existing)
