"""`ddiloco run --network hosts`: the same run, each process on a host of its own, behind real links.

Hosts: `launcher` (the supervisor's own connections: status, stop, evaluation fetches; unshaped),
`sync0`..`sync{S-1}` (one per synchronizer shard) and `learner0`..`learner{M-1}`. `--link SPEC` is
every learner's link; `--link learnerN=SPEC` or `--link syncS=SPEC` one host's (repeatable).

The launcher process stays in the root namespace for everything it makes (the hosts, the dashboard's
listening socket, the processes: `ip netns exec HOST ...`) and moves only its main thread, before
it opens any connection, into the `launcher` host (`setns`): threads and sockets made afterwards
(gRPC's included) live there, so the root namespace still has no address or route on the network.
Before the run every learner's link to shard 0 is measured (round trip, throughput each way); after
it, the bytes and drops each link carried. Both are printed and kept in the run directory
(`network.json`) and the summary (`network`). Everything is removed by `close()` (with, atexit).
"""

from __future__ import annotations

import ctypes
import dataclasses
import json
import os
import re
import secrets
import select
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .commands import HostsUnavailable, require_hosts
from .network import Network
from .shaping import LinkSpec

CLONE_NEWNET = 0x40000000
SPEC_KEYS = ("rate", "latency", "jitter", "loss")
HOST_RE = re.compile(r"(learner|sync)(\d+)")
PROBE_SECONDS = 1.0
PROBE_TIMEOUT_S = 60.0


@dataclass(frozen=True)
class HostsPlan:
    """Which hosts a run gets and each one's link (host name -> spec; a host not named is unshaped)."""

    learners: int
    shards: int
    links: dict[str, LinkSpec]

    @classmethod
    def parse(cls, values: Sequence[str], learners: int, shards: int) -> HostsPlan:
        """`--link` values: `SPEC` (every learner), `learnerN=SPEC`, `syncS=SPEC`; each host once."""
        default: LinkSpec | None = None
        own: dict[str, LinkSpec] = {}
        for value in values:
            head, sep, rest = value.partition("=")
            named = sep and head.strip() not in SPEC_KEYS
            try:
                spec = LinkSpec.parse(rest if named else value)
            except ValueError as e:
                raise ValueError(f"--link {value!r}: {e}") from None
            if not named:
                if default is not None:
                    raise ValueError(f"--link {value!r}: every learner's link is given twice")
                default = spec
                continue
            host = head.strip()
            m = HOST_RE.fullmatch(host)
            limit = learners if m and m.group(1) == "learner" else shards
            if not m or int(m.group(2)) >= limit:
                syncs = f" and sync0..sync{shards - 1}" if shards else ""
                raise ValueError(
                    f"--link {value!r}: no host {host!r}; hosts are learner0..learner{learners - 1}{syncs} "
                    "(or give SPEC alone for every learner)"
                )
            if host in own:
                raise ValueError(f"--link {value!r}: host {host}'s link is given twice")
            own[host] = spec
        links = {f"learner{m}": default for m in range(learners) if default is not None}
        return cls(learners, shards, {**links, **own})

    @property
    def names(self) -> list[str]:
        return ["launcher", *(f"sync{s}" for s in range(self.shards)), *(f"learner{m}" for m in range(self.learners))]


def host_of(child: str) -> str:
    """The host of a supervised process: `sync-0` runs on `sync0`, `learner-3` on `learner3`."""
    return child.replace("-", "")


def _setns(fd: int) -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.setns(fd, CLONE_NEWNET) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"setns: {os.strerror(err)}")


class HostsRun:
    """The hosts of one run: made and measured on construction, removed by `close()`."""

    def __init__(self, plan: HostsPlan, run_dir: Path, probe_seconds: float = PROBE_SECONDS) -> None:
        require_hosts()
        self.plan, self.run_dir = plan, run_dir
        self.net = Network(plan.names, links=plan.links)
        self._home: int | None = None  # the main thread's own namespace while it is in the launcher's
        self.started = time.time()
        try:
            self.probes = self._measure(probe_seconds)
            self.before_run = {name: self.net.counters(name) for name in plan.names}  # the probes' bytes
        except BaseException:
            self.net.close()
            raise

    # --- hooks for the launcher ------------------------------------------------------------------
    def configure(self, config: Any) -> Any:
        """The run's config with each shard listening on its host's address, and a token (beyond
        loopback a synchronizer refuses to run without one; one is made unless given)."""
        addresses = tuple(self.net.address(f"sync{s}") for s in range(self.plan.shards))
        network = dataclasses.replace(config.network, sync_hosts=tuple(addresses))
        return dataclasses.replace(config, network=network, token=config.token or secrets.token_hex(16))

    def wrap(self, child: str, argv: Sequence[str]) -> list[str]:
        """The command that runs the supervised process `child` (`sync-0`, `learner-2`) on its host."""
        return self.net.command(host_of(child), argv)

    def enter(self) -> None:
        """Move the calling (main) thread into the launcher's host: what it opens from now on, and
        the threads it starts, are there."""
        if self._home is None:
            home = os.open("/proc/thread-self/ns/net", os.O_RDONLY)
            target = os.open(f"/run/netns/{self.net['launcher'].netns}", os.O_RDONLY)
            try:
                _setns(target)
            except OSError:
                os.close(home)
                raise
            finally:
                os.close(target)
            self._home = home

    def leave(self) -> None:
        """Back to the namespace the thread came from."""
        if self._home is not None:
            home, self._home = self._home, None
            try:
                _setns(home)
            finally:
                os.close(home)

    # --- measuring ------------------------------------------------------------------------------
    def _measure(self, seconds: float) -> dict[str, dict]:
        """Each learner's link to shard 0 (to the launcher's host in a run without shards: the
        data-parallel workers'), one after the other (so no two share a link)."""
        py = [sys.executable, "-m", "ddiloco.hosts.probe"]
        to = "sync0" if self.plan.shards else "launcher"
        sync = self.net.address(to)
        server = self.net.popen(to, [*py, "serve", sync, "0"], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        try:
            assert server.stdout is not None
            ready, _, _ = select.select([server.stdout], [], [], PROBE_TIMEOUT_S)
            port = server.stdout.readline().strip() if ready else ""
            if not port.isdigit():
                raise HostsUnavailable(f"the link probe did not start in host {to} (it said {port!r})")
            out = {}
            for m in range(self.plan.learners):
                host = f"learner{m}"
                probe = self.net.popen(host, [*py, "measure", sync, port, str(seconds)], stdout=subprocess.PIPE)
                text, _ = probe.communicate(timeout=PROBE_TIMEOUT_S)
                if probe.returncode != 0:
                    raise HostsUnavailable(f"the link probe from {host} to {to} failed (code {probe.returncode})")
                out[host] = {"to": to, **json.loads(text)}
            return out
        finally:
            if server.stdin is not None:
                server.stdin.close()  # the server ends; close() stops it anyway

    def hosts(self, carried: bool) -> dict[str, dict]:
        """Per host: its address and link, what it measured before the run, and (`carried`) the
        bytes and drops its link carried since the hosts were made, with their average rate, and the
        bytes it carried after the measuring (`run_sent_bytes`, `run_received_bytes`: the run's own)."""
        seconds = max(1e-9, time.time() - self.started)
        out = {}
        for name in self.plan.names:
            row = {"address": self.net.address(name), "link": str(self.net[name].link), **self.probes.get(name, {})}
            if carried:
                c = self.net.counters(name)
                row.update(c)
                row["sent_mbit_s_avg"] = round(c["sent_bytes"] * 8 / seconds / 1e6, 3)
                row["received_mbit_s_avg"] = round(c["received_bytes"] * 8 / seconds / 1e6, 3)
                before = self.before_run[name]
                row["run_sent_bytes"] = c["sent_bytes"] - before["sent_bytes"]
                row["run_received_bytes"] = c["received_bytes"] - before["received_bytes"]
            out[name] = row
        return out

    def report(self) -> dict:
        """The run's network, written to the run directory's network.json and returned for the summary."""
        report = {"prefix": self.net.prefix, "namespaces": self.net.namespaces, "hosts": self.hosts(carried=True)}
        (self.run_dir / "network.json").write_text(json.dumps(report, indent=1, sort_keys=True) + "\n")
        return report

    def close(self) -> None:
        self.leave()
        self.net.close()

    def __enter__(self) -> HostsRun:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def describe(hosts: dict[str, dict]) -> list[str]:
    """One line per host: the link asked for, what it measured, what it carried."""
    lines = []
    for name, h in hosts.items():
        line = f"{name:<10} {h['address']:<13} {h['link']}"
        if "rtt_ms_median" in h:
            line += f"; rtt {h['rtt_ms_median']:g} ms, up {h['up_mbit_s']:g} / down {h['down_mbit_s']:g} Mbit/s"
        if "sent_bytes" in h:
            line += (
                f"; carried {h['sent_bytes'] / 1e6:.1f} MB out, {h['received_bytes'] / 1e6:.1f} MB in, "
                f"dropped {h['sent_dropped']} out / {h['received_dropped']} in (packets)"
            )
        lines.append(line)
    return lines
