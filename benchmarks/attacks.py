"""An honest learner's merged contributions under the resource attacks of issue #32, against its
figure without them.

One synchronizer in this process on 127.0.0.1 (gRPC and the bulk socket plane, with a token), its
dashboard, and one honest learner training a small MLP in a thread (as tests/support/runtime.py's
`mlp_run`, with the token). The learner's contributions taken in over a window are counted with no
attack, then under each attack in turn. An attack is a process of its own (`attack_clients.py`; an
attacker is another program) that opens its connections, keeps them open for the window (re-opening
any the synchronizer closes) and closes them all at the end:

    silent          100 bulk-socket connections that say nothing
    pre-auth        300 bulk-socket connections trickling 1 byte every 0.5 s, never finishing the hello
    refused pushes  30 authenticated pushes of a garbage frame, then 1 byte every 0.2 s
    unread fetches  30 fetches never read, 2 on each of 15 live sessions (a token holder registers them
                    and keeps them alive with heartbeats): each session's cap and the 4 fetch places full,
                    the fetches beyond them refused and re-opened every 0.5 s
    dashboard       400 silent connections to the dashboard
    silent gRPC     1100 silent connections to the gRPC port (#46)
    waiting places  128 silent bulk-socket connections from 8 addresses (127.0.0.10-17), twice the places
    fetch squatting 4 unread fetches of 2 sessions (2 each: with 2 per session they held all 4 places)
    12-byte hello   the hello of #46 that stopped the bulk socket's reader for good (last)

A fetch that is never read holds its place only once the model no longer fits the kernel's socket
buffers (a few MB on loopback): any real model, not this small one. So the synchronizer's bulk socket
send buffer is set to 4 kB and each fetching client's receive buffer to 4 kB, and a fetch of this
model blocks as a real one would. The synchronizer runs with no grace window (K = 1): the token
holder's sessions are live learners that never push, and a grace window would wait for them, which
is what any idle learner costs, not what its fetches cost.

The acceptance (#32): under each attack, at least 0.8x the contributions of the window without one.
Every learner step is padded to --step-seconds, so that the learner behaves like its own accelerator
instead of racing the attack for this machine's cores.

    python benchmarks/attacks.py                  # 20 s windows (~2.5 minutes)
    python benchmarks/attacks.py --quick --json   # 8 s windows (~2 minutes)
    python benchmarks/attacks.py --quick --large  # two fragments of ~10M parameters each
"""

from __future__ import annotations

import argparse
import json
import logging
import resource
import socket
import threading
import time

import torch
from attack_clients import (
    ATTACKS,
    HOST,
    SMALL_BUFFER,
    TOKEN,
    AttackProcess,
    SessionHolder,
    raise_fd_limit,
)
from rich.console import Console
from rich.table import Table

from ddiloco.core import AlgorithmConfig
from ddiloco.launch.dashboard import Dashboard
from ddiloco.launch.shardstate import ShardState
from ddiloco.learner.client import LearnerClient
from ddiloco.synchronizer.bulk_socket import MAX_FETCHING
from ddiloco.synchronizer.server import SynchronizerServer, build_service
from ddiloco.synchronizer.settings import ServiceSettings
from ddiloco.wire.protocol import signature

console = Console(stderr=True, width=190)
FD_MARGIN = 256  # descriptors for everything else: the server's listeners, gRPC, the learner, Python


WIDTH = 64  # the hidden width; --large: LARGE_WIDTH, two fragments of about 10M parameters each
LARGE_WIDTH = 4500


def make_model() -> torch.nn.Module:
    """The honest learner's model: small, but larger (20 kB) than what a 4 kB socket buffer takes."""
    return torch.nn.Sequential(
        torch.nn.Linear(8, WIDTH),
        torch.nn.ReLU(),
        torch.nn.Linear(WIDTH, WIDTH),
        torch.nn.ReLU(),
        torch.nn.Linear(WIDTH, 1),
    )


class HonestLearner(threading.Thread):
    """A small MLP trained with SGD, its steps padded to `step_seconds`, until stopped."""

    def __init__(self, address: str, step_seconds: float) -> None:
        super().__init__(name="honest-learner", daemon=True)
        torch.manual_seed(0)
        self.model = make_model()
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
        """Whether the learner still pushes on the bulk socket (it sets it aside for a pause, for gRPC,
        when it cannot reach it)."""
        return all(
            link.uplink.socket is not None and time.monotonic() >= link.uplink.socket_paused_until
            for link in self.client.links
        )

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


def window(learner: HonestLearner, seconds: float, server: SynchronizerServer) -> dict:
    """Over `seconds`: the contributions the synchronizer took in from the learner, how many of its
    pushes fell back from the bulk socket to gRPC, the most fetch places held at once (sampled every
    0.1 s), and the bulk socket's refusals by reason as Status counts them."""
    assert server.bulk is not None
    closed0 = server.service.status()["bulk"]["closed"]
    before, fell_back, fetching = learner.accepted(), learner.fallbacks(), 0
    ends = time.monotonic() + seconds
    for _ in range(int(seconds * 10) + 10):
        fetching = max(fetching, MAX_FETCHING - server.bulk._fetching._value)  # noqa: SLF001 - a gauge
        if time.monotonic() >= ends:
            break
        time.sleep(min(0.1, max(0.0, ends - time.monotonic())))
    if learner.error is not None:
        raise RuntimeError(f"the honest learner failed: {learner.error!r}")
    closed = server.service.status()["bulk"]["closed"]
    return {
        "merged": learner.accepted() - before,
        "fallbacks": learner.fallbacks() - fell_back,
        "fetch_places_held_max": fetching,
        "closed": {k: v - closed0.get(k, 0) for k, v in closed.items() if v > closed0.get(k, 0)},
    }


def _reasons(closed: dict[str, int]) -> str:
    return ", ".join(f"{k} {v}" for k, v in sorted(closed.items())) or "-"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true", help="8 s windows")
    p.add_argument("--json", action="store_true", help="end with one line of JSON")
    p.add_argument("--window", type=float, default=None, help="seconds per measurement (default 20, --quick: 8)")
    p.add_argument("--step-seconds", type=float, default=0.01, help="pad every learner step to this long (0: unpadded)")
    p.add_argument("--large", action="store_true", help="two fragments of about 10M parameters each")
    p.add_argument("--only", default=None, help="comma-separated attack names (default: all)")
    p.add_argument("--settle", type=float, default=2.0, help="seconds between one attack's end and the next window")
    args = p.parse_args()
    seconds = args.window if args.window is not None else (8.0 if args.quick else 20.0)
    global WIDTH
    WIDTH = LARGE_WIDTH if args.large else WIDTH
    attacks = [a for a in ATTACKS if args.only is None or a.name in args.only.split(",")]
    limit = raise_fd_limit()
    # each connection costs a descriptor here and (while the server holds it) one in the server
    most = max(1, (limit - FD_MARGIN) // 2) if limit != resource.RLIM_INFINITY else 1 << 20
    logging.getLogger("ddiloco").setLevel(logging.ERROR)  # the refusals the attacks cause are expected

    torch.manual_seed(0)
    params = {n: q.detach().clone() for n, q in make_model().named_parameters()}
    service = build_service(
        params, AlgorithmConfig(fragments=2, sync_every=4, overlap=1, grace=0.0), ServiceSettings(tokens=10**12)
    )
    server = SynchronizerServer(service, HOST, 0, TOKEN, bulk_socket=True)
    board: Dashboard | None = None
    learner: HonestLearner | None = None
    attack: AttackProcess | None = None
    holder: SessionHolder | None = None
    results: dict[str, dict] = {}
    try:
        address = server.start()
        assert server.bulk is not None
        # accepted connections inherit it: a fetch blocks once 4 kB wait unread (see the docstring)
        server.bulk.listener.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, SMALL_BUFFER)
        board = Dashboard(ShardState(service.status, "decoupled", 1), HOST, 0, TOKEN)
        board.start()
        ports = {
            "bulk": server.handlers.bulk_port,
            "dashboard": board.server.server_address[1],
            "grpc": int(address.rsplit(":", 1)[1]),
        }
        learner = HonestLearner(address, args.step_seconds)
        learner.start()
        deadline = time.monotonic() + 60
        while learner.accepted() < 4 and time.monotonic() < deadline and learner.error is None:  # warm up
            time.sleep(0.1)
        if learner.error is not None or learner.accepted() < 4:
            raise RuntimeError(f"the honest learner did not get going: {learner.error!r}")
        console.print(f"no attack: {seconds:g} s window ...")
        quiet = window(learner, seconds, server)
        baseline, baseline_fallbacks = quiet["merged"], quiet["fallbacks"]
        baseline_on_bulk = learner.on_bulk_socket()
        console.print(f"  {baseline} contributions merged")
        for spec in attacks:
            if spec.hello == "Fetch":  # the token holder's sessions, live for this attack only
                holder = SessionHolder(address, signature(params), spec.fetch_sessions)
                holder.start()
            n = min(spec.connections, most)
            attack = AttackProcess(spec, ports[spec.port], n, holder.sessions if holder is not None else [])
            attack.start()
            console.print(f"{spec.name}: {n} connections, {seconds:g} s window ...")
            seen = window(learner, seconds, server)
            merged = seen["merged"]
            did = attack.stop()
            attack = None
            if holder is not None:
                holder.stop()  # its sessions leave before the next window
                holder = None
            if did["error"] is not None:
                raise RuntimeError(f"attack {spec.name} failed: {did['error']}")
            results[spec.name] = {
                "connections": n,
                **did,
                **seen,
                "on_bulk_socket": learner.on_bulk_socket(),
                "ratio": merged / baseline if baseline else 0.0,
            }
            console.print(f"  {merged} contributions merged")
            time.sleep(args.settle)
    finally:
        if attack is not None:
            attack.stop()
        if holder is not None:
            holder.stop()
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
        "fetch places held (max)",
        "bulk socket closed (Status, by reason)",
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
        str(quiet["fetch_places_held_max"]),
        _reasons(quiet["closed"]),
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
            str(r["fetch_places_held_max"]),
            _reasons(r["closed"]),
        )
    console.print(table)
    min_ratio = min(r["ratio"] for r in results.values())
    console.print(f"lowest ratio: {min_ratio:.2f} (the acceptance: >= 0.8 under every attack)")
    if args.json:
        keys = ("connections", "merged", "ratio", "fallbacks", "fetch_places_held_max", "closed")
        attacks = {k: {key: r[key] for key in keys} for k, r in results.items()}
        print(
            json.dumps(
                {"window_seconds": seconds, "baseline": baseline, "attacks": attacks, "min_ratio": min_ratio},
                sort_keys=False,
            )
        )


if __name__ == "__main__":
    main()
