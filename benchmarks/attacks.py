"""An honest learner's merged contributions under the resource attacks of issue #32, against its
figure without them.

One synchronizer in this process on 127.0.0.1 (gRPC and the bulk socket plane, with a token), its
dashboard, and one honest learner training a small MLP in a thread (as tests/support/runtime.py's
`mlp_run`, with the token). The learner's contributions taken in over a window are counted with no
attack, then under each attack in turn. An attack is a thread that opens its connections, keeps them
open for the window (re-opening any the synchronizer closes) and closes them all at the end:

    silent          100 bulk-socket connections that say nothing
    pre-auth        300 bulk-socket connections trickling 1 byte every 0.5 s, never finishing the hello
    refused pushes  30 authenticated pushes of a garbage frame, then 1 byte every 0.2 s
    unread fetches  30 authenticated fetches that are never read
    dashboard       400 silent connections to the dashboard

The acceptance (#32): under each attack, at least 0.8x the contributions of the window without one.
Every learner step is padded to --step-seconds, so that the learner behaves like its own accelerator
instead of racing the attack for this machine's cores.

    python benchmarks/attacks.py                  # 20 s windows (~2.5 minutes)
    python benchmarks/attacks.py --quick --json   # 8 s windows (~1 minute)
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import resource
import select
import socket
import struct
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

import torch
from rich.console import Console
from rich.table import Table

from ddiloco.core import AlgorithmConfig
from ddiloco.launch.dashboard import Dashboard
from ddiloco.launch.shardstate import ShardState
from ddiloco.learner.client import LearnerClient
from ddiloco.synchronizer.server import SynchronizerServer, build_service
from ddiloco.synchronizer.settings import ServiceSettings
from ddiloco.wire import sockets

console = Console(stderr=True, width=150)
HOST = "127.0.0.1"
TOKEN = "bench-attack-token"
FD_MARGIN = 256  # descriptors for everything else: the server's listeners, gRPC, the learner, Python
TCP_ESTABLISHED = 1
MAX_REOPENS_PER_ROUND = 1_000


@dataclass(frozen=True)
class Attack:
    name: str
    connections: int
    port: str  # "bulk" or "dashboard"
    open_one: Callable[[socket.socket], None]  # what a connection sends once connected
    tick: Callable[[socket.socket], None] | None  # what it sends every `interval`
    interval: float


def _hello(method: str) -> Callable[[socket.socket], None]:
    def send(sock: socket.socket) -> None:
        sockets.send_small(sock, {"method": method, "token": TOKEN}, sockets.Deadline(10))
        if method == "Push":
            sock.sendall(b"x" * 64)  # not a frame: the push is refused, and then drained

    return send


def _one_byte(sock: socket.socket) -> None:
    sock.send(b"x")


def _nothing(sock: socket.socket) -> None:
    pass


ATTACKS = [
    Attack("silent", 100, "bulk", _nothing, None, 0.5),
    Attack("pre-auth trickle", 300, "bulk", _nothing, _one_byte, 0.5),
    Attack("refused pushes", 30, "bulk", _hello("Push"), _one_byte, 0.2),
    Attack("unread fetches", 30, "bulk", _hello("Fetch"), None, 0.5),
    Attack("dashboard", 400, "dashboard", _nothing, None, 0.5),
]


def _closed_by_peer(sock: socket.socket) -> bool:
    """Whether the other end closed (or reset) the connection, without reading what it sent."""
    if hasattr(socket, "TCP_INFO"):
        try:
            return sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, 1)[0] != TCP_ESTABLISHED
        except OSError:
            return True
    try:
        readable, _, _ = select.select([sock], [], [], 0)
        return bool(readable) and sock.recv(1, socket.MSG_PEEK) == b""
    except OSError:
        return True


class AttackThread(threading.Thread):
    """Holds `attack.connections` connections open until stopped, re-opening those the peer closes."""

    def __init__(self, attack: Attack, port: int, connections: int) -> None:
        super().__init__(name=f"attack-{attack.name}", daemon=True)
        self.attack, self.port, self.connections = attack, port, connections
        self.socks: list[socket.socket] = []
        self.opened = 0  # connections opened, first ones and re-opened ones
        self.failed = 0  # connects or sends that failed
        self.ready = threading.Event()  # every connection opened once
        self.halt = threading.Event()
        self.error: BaseException | None = None

    def _open(self) -> socket.socket | None:
        sock = None
        try:
            sock = socket.create_connection((HOST, self.port), timeout=2.0)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))  # close = reset
            self.attack.open_one(sock)
            sock.settimeout(0.0)  # never wait on a full send buffer: a stalled trickle is still a trickle
            self.opened += 1
            return sock
        except OSError:
            self.failed += 1
            if sock is not None:
                sock.close()
            return None

    def run(self) -> None:
        try:
            for _ in range(self.connections):
                if self.halt.is_set():
                    return
                sock = self._open()
                if sock is not None:
                    self.socks.append(sock)
            self.ready.set()
            while not self.halt.wait(self.attack.interval):
                self._round()
        except BaseException as exc:  # noqa: BLE001 - reported by main
            self.error = exc
        finally:
            self.ready.set()
            for sock in self.socks:
                sock.close()
            self.socks.clear()

    def _round(self) -> None:
        """One pass: trickle where the attack does, replace what the peer closed (bounded per round)."""
        kept: list[socket.socket] = []
        for sock in self.socks:
            alive = not _closed_by_peer(sock)
            if alive and self.attack.tick is not None:
                try:
                    self.attack.tick(sock)
                except BlockingIOError:
                    pass  # the peer stopped reading: the connection is still held
                except OSError:
                    alive = False
            if alive:
                kept.append(sock)
            else:
                sock.close()
        for _ in range(min(self.connections - len(kept), MAX_REOPENS_PER_ROUND)):
            if self.halt.is_set():
                break
            sock = self._open()
            if sock is not None:
                kept.append(sock)
        self.socks = kept

    def stop(self) -> None:
        self.halt.set()
        self.join(10)


class HonestLearner(threading.Thread):
    """A small MLP trained with SGD, its steps padded to `step_seconds`, until stopped."""

    def __init__(self, address: str, step_seconds: float) -> None:
        super().__init__(name="honest-learner", daemon=True)
        torch.manual_seed(0)
        self.model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1))
        self.client = LearnerClient(self.model, address, learner_id=0, token=TOKEN, report_every=1e9)
        self.step_seconds = step_seconds
        self.halt = threading.Event()
        self.error: BaseException | None = None

    def accepted(self) -> int:
        return int(self.client.stats()["accepted"])

    def fallbacks(self) -> int:
        """Pushes the bulk socket failed and gRPC carried (learner/uplink.py)."""
        return sum(link.uplink.fallbacks for link in self.client.links)

    def on_bulk_socket(self) -> bool:
        """Whether the learner still pushes on the bulk socket (it gives it up for gRPC if unreachable)."""
        return all(link.uplink.socket is not None for link in self.client.links)

    def run(self) -> None:
        try:
            self.client.start()
            optimizer = torch.optim.SGD(self.model.parameters(), lr=1e-2)
            for _ in range(10_000_000):
                if self.halt.is_set() or self.client.stopping:
                    break
                started = time.monotonic()
                x = torch.randn(16, 8)
                self.model(x).pow(2).mean().backward()
                optimizer.step()
                optimizer.zero_grad()
                self.client.step(tokens=16)
                self.halt.wait(max(0.0, self.step_seconds - (time.monotonic() - started)))
        except BaseException as exc:  # noqa: BLE001 - reported by main
            self.error = exc

    def stop(self) -> None:
        self.halt.set()
        self.join(30)
        self.client.close()


def raise_fd_limit() -> int:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard == resource.RLIM_INFINITY or soft < hard:
        with contextlib.suppress(ValueError, OSError):
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    return resource.getrlimit(resource.RLIMIT_NOFILE)[0]


def window(learner: HonestLearner, seconds: float) -> tuple[int, int]:
    """The contributions the synchronizer took in from the learner over `seconds`, and how many of its
    pushes fell back from the bulk socket to gRPC meanwhile."""
    before, fell_back = learner.accepted(), learner.fallbacks()
    time.sleep(seconds)
    if learner.error is not None:
        raise RuntimeError(f"the honest learner failed: {learner.error!r}")
    return learner.accepted() - before, learner.fallbacks() - fell_back


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true", help="8 s windows")
    p.add_argument("--json", action="store_true", help="end with one line of JSON")
    p.add_argument("--window", type=float, default=None, help="seconds per measurement (default 20, --quick: 8)")
    p.add_argument("--step-seconds", type=float, default=0.01, help="pad every learner step to this long (0: unpadded)")
    p.add_argument("--settle", type=float, default=2.0, help="seconds between one attack's end and the next window")
    args = p.parse_args()
    seconds = args.window if args.window is not None else (8.0 if args.quick else 20.0)
    limit = raise_fd_limit()
    # each connection costs a descriptor here and (while the server holds it) one in the server
    most = max(1, (limit - FD_MARGIN) // 2) if limit != resource.RLIM_INFINITY else 1 << 20
    logging.getLogger("ddiloco").setLevel(logging.ERROR)  # the refusals the attacks cause are expected

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1))
    params = {n: q.detach().clone() for n, q in model.named_parameters()}
    service = build_service(
        params, AlgorithmConfig(fragments=2, sync_every=4, overlap=1), ServiceSettings(tokens=10**12)
    )
    server = SynchronizerServer(service, HOST, 0, TOKEN, bulk_socket=True)
    board: Dashboard | None = None
    learner: HonestLearner | None = None
    attack: AttackThread | None = None
    results: dict[str, dict] = {}
    try:
        address = server.start()
        board = Dashboard(ShardState(service.status, "decoupled", 1), HOST, 0, TOKEN)
        board.start()
        ports = {"bulk": server.handlers.bulk_port, "dashboard": board.server.server_address[1]}
        learner = HonestLearner(address, args.step_seconds)
        learner.start()
        deadline = time.monotonic() + 60
        while learner.accepted() < 4 and time.monotonic() < deadline and learner.error is None:  # warm up
            time.sleep(0.1)
        if learner.error is not None or learner.accepted() < 4:
            raise RuntimeError(f"the honest learner did not get going: {learner.error!r}")
        console.print(f"no attack: {seconds:g} s window ...")
        baseline, baseline_fallbacks = window(learner, seconds)
        baseline_on_bulk = learner.on_bulk_socket()
        console.print(f"  {baseline} contributions merged")
        for spec in ATTACKS:
            n = min(spec.connections, most)
            attack = AttackThread(spec, ports[spec.port], n)
            attack.start()
            attack.ready.wait(60)
            console.print(f"{spec.name}: {n} connections ({attack.failed} failed to open), {seconds:g} s window ...")
            merged, fallbacks = window(learner, seconds)
            held = len(attack.socks)
            attack.stop()
            if attack.error is not None:
                raise RuntimeError(f"attack {spec.name} failed: {attack.error!r}")
            results[spec.name] = {
                "connections": n,
                "held_at_end": held,
                "opened": attack.opened,
                "failed": attack.failed,
                "merged": merged,
                "fallbacks": fallbacks,
                "on_bulk_socket": learner.on_bulk_socket(),
                "ratio": merged / baseline if baseline else 0.0,
            }
            attack = None
            console.print(f"  {merged} contributions merged")
            time.sleep(args.settle)
    finally:
        if attack is not None:
            attack.stop()
        if learner is not None:
            learner.stop()
        if board is not None:
            board.stop()
        server.stop(grace=0.5)

    table = Table(title=f"an honest learner's merged contributions per {seconds:g} s window, under attack (#32)")
    for col in (
        "attack",
        "connections",
        "opened (re-opened)",
        "merged",
        "ratio",
        ">= 0.8?",
        "pushes fallen back to gRPC",
        "learner on bulk socket after",
    ):
        table.add_column(col, justify="right")
    table.add_row(
        "none",
        "0",
        "-",
        str(baseline),
        "1.00",
        "-",
        str(baseline_fallbacks),
        "yes" if baseline_on_bulk else "no (gRPC)",
    )
    for name, r in results.items():
        table.add_row(
            name,
            str(r["connections"]),
            f"{r['opened']} ({r['opened'] - r['connections']})",
            str(r["merged"]),
            f"{r['ratio']:.2f}",
            "yes" if r["ratio"] >= 0.8 else "[red]NO[/red]",
            str(r["fallbacks"]),
            "yes" if r["on_bulk_socket"] else "no (gRPC)",
        )
    console.print(table)
    min_ratio = min(r["ratio"] for r in results.values())
    console.print(f"lowest ratio: {min_ratio:.2f} (the acceptance: >= 0.8 under every attack)")
    if args.json:
        attacks = {
            k: {"connections": r["connections"], "merged": r["merged"], "ratio": r["ratio"]} for k, r in results.items()
        }
        print(
            json.dumps(
                {"window_seconds": seconds, "baseline": baseline, "attacks": attacks, "min_ratio": min_ratio},
                sort_keys=False,
            )
        )


if __name__ == "__main__":
    main()
