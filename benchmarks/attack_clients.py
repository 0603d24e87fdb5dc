"""The attackers of benchmarks/attacks.py (#32's resource attacks): each a process of its own (as an
attacker is another program: its work must not take the interpreter lock from the synchronizer and
the honest learner it attacks) whose thread holds its connections open for a window, re-opening
those the synchronizer closes; and the token holder's live sessions the unread fetches name."""

from __future__ import annotations

import contextlib
import itertools
import multiprocessing
import resource
import select
import socket
import struct
import threading
from dataclasses import dataclass

import grpc

from ddiloco.wire import framing, rpc, sockets

HOST = "127.0.0.1"
TOKEN = "bench-attack-token"
TCP_ESTABLISHED = 1
MAX_REOPENS_PER_ROUND = 1_000
SMALL_BUFFER = 4096  # bytes: the fetchers' receive buffers and the synchronizer's bulk send buffer
FETCH_SESSIONS = 15  # the token holder's sessions: 2 fetches each (their cap), 30 in all


@dataclass(frozen=True)
class Attack:
    """What each connection does (plain values: it travels to the attacker's process)."""

    name: str
    connections: int
    port: str  # "bulk" or "dashboard"
    hello: str  # what a connection sends once connected: "" (nothing), "Push" or "Fetch"
    trickle: bool  # one byte every `interval`
    interval: float
    small_window: bool = False  # a receive buffer of SMALL_BUFFER bytes, set before connecting
    sources: int = 1  # source addresses, 127.0.0.10 on, in turn (1: 127.0.0.1)
    raw: bytes = b""  # sent once connected, before any hello
    fetch_sessions: int = FETCH_SESSIONS  # the token holder's sessions the fetches name in turn


def raise_fd_limit() -> int:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard == resource.RLIM_INFINITY or soft < hard:
        with contextlib.suppress(ValueError, OSError):
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    return resource.getrlimit(resource.RLIMIT_NOFILE)[0]


class SessionHolder(threading.Thread):
    """A token holder's live sessions (learner ids 1..n, registered over gRPC and kept alive by
    heartbeats, registered again if declared gone), handed out in turn to the fetches it opens."""

    def __init__(self, address: str, signature: str, n: int) -> None:
        super().__init__(name="attack-sessions", daemon=True)
        self.channel = rpc.open_channel(address, "raw", framing.DEFAULT_CHUNK_BYTES + rpc.FRAME_MARGIN)
        self.stubs = rpc.Stubs(self.channel, TOKEN)
        self.signature, self.n = signature, n
        self.sessions: list[str] = []
        self.halt = threading.Event()

    def start(self) -> None:
        """Register the sessions (only now: they are live learners from then on), then keep them alive."""
        self.sessions = [self._register(m) for m in range(1, self.n + 1)]
        super().start()

    def _call(self, method: str, head: dict) -> dict:
        return framing.read_message(self.stubs.call(method, framing.message(head), 5.0))

    def _register(self, learner: int) -> str:
        head = {"learner": learner, "incarnation": f"attacker{learner}", "signature": self.signature, "fresh": True}
        return str(self._call("Register", head)["session"])

    def run(self) -> None:
        while not self.halt.wait(0.5):
            for i, session in enumerate(self.sessions):
                with contextlib.suppress(grpc.RpcError):
                    if self._call("Heartbeat", {"session": session}).get("ok") is not True:
                        self.sessions[i] = self._register(i + 1)

    def stop(self) -> None:
        self.halt.set()
        if self.is_alive():
            self.join(10)
        for session in self.sessions:  # gone, so that the next attacks find one learner only
            with contextlib.suppress(grpc.RpcError):
                self._call("Leave", {"session": session})
        self.channel.close()


ATTACKS = [
    Attack("silent", 100, "bulk", "", False, 0.5),
    Attack("pre-auth trickle", 300, "bulk", "", True, 0.5),
    Attack("refused pushes", 30, "bulk", "Push", True, 0.2),
    Attack("unread fetches", 2 * FETCH_SESSIONS, "bulk", "Fetch", False, 0.5, small_window=True),
    Attack("dashboard", 400, "dashboard", "", False, 0.5),
    # #46's: the gRPC port's silent connections, the socket's waiting places from 8 addresses (16 each,
    # twice the 64 places), two sessions' unread fetches (two each), and the 12-byte hello (last: on a
    # synchronizer without its fix it stops the bulk socket for good)
    Attack("silent gRPC", 1100, "grpc", "", False, 0.5),
    Attack("waiting places (8 addresses)", 128, "bulk", "", False, 0.2, sources=8),
    Attack("fetch squatting (2 sessions)", 4, "bulk", "Fetch", False, 0.5, small_window=True, fetch_sessions=2),
    Attack("12-byte hello", 1, "bulk", "", False, 0.5, raw=b"\x08\x00\x00\x00DDL\x01\x00\x00\x00\x00"),
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

    def __init__(self, attack: Attack, port: int, connections: int, sessions: list[str]) -> None:
        super().__init__(name=f"attack-{attack.name}", daemon=True)
        self.attack, self.port, self.connections, self.sessions = attack, port, connections, sessions
        self.turn = itertools.count()
        self.source = itertools.count()
        self.socks: list[socket.socket] = []
        self.opened = 0  # connections opened, first ones and re-opened ones
        self.failed = 0  # connects or sends that failed
        self.ready = threading.Event()  # every connection opened once
        self.halt = threading.Event()
        self.error: BaseException | None = None

    def _open(self) -> socket.socket | None:
        sock = None
        try:
            sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            if self.attack.small_window:
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, SMALL_BUFFER)
            if self.attack.sources > 1:
                sock.bind((f"127.0.0.{10 + next(self.source) % self.attack.sources}", 0))
            sock.settimeout(2.0)
            sock.connect((HOST, self.port))
            if self.attack.raw:
                sock.sendall(self.attack.raw)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))  # close = reset
            self._hello(sock)
            sock.settimeout(0.0)  # never wait on a full send buffer: a stalled trickle is still a trickle
            self.opened += 1
            return sock
        except OSError:
            self.failed += 1
            if sock is not None:
                sock.close()
            return None

    def _hello(self, sock: socket.socket) -> None:
        if not self.attack.hello:
            return
        hello = {"method": self.attack.hello, "token": TOKEN}
        if self.attack.hello == "Fetch":  # the token holder's sessions in turn: 2 fetches each
            hello["session"] = self.sessions[next(self.turn) % len(self.sessions)]
        sockets.send_small(sock, hello, sockets.Deadline(10))
        if self.attack.hello == "Push":
            sock.sendall(b"x" * 64)  # not a frame: the push is refused, and then drained

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
            if alive and self.attack.trickle:
                try:
                    sock.send(b"x")
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


def _attacker(attack: Attack, port: int, connections: int, sessions: list[str], ready, halt, results) -> None:
    """The attacker's process: its thread until `halt`, then what it did, on `results`."""
    raise_fd_limit()
    thread = AttackThread(attack, port, connections, sessions)
    thread.start()
    thread.ready.wait(60)
    ready.set()
    halt.wait(3600)
    held = len(thread.socks)
    thread.stop()
    error = repr(thread.error) if thread.error is not None else None
    results.put({"held_at_end": held, "opened": thread.opened, "failed": thread.failed, "error": error})


class AttackProcess:
    """An attack run in a process of its own (spawned: nothing of this process's threads is copied)."""

    def __init__(self, attack: Attack, port: int, connections: int, sessions: list[str]) -> None:
        ctx = multiprocessing.get_context("spawn")
        self.attack, self.ready, self.halt, self.results = attack, ctx.Event(), ctx.Event(), ctx.Queue()
        args = (attack, port, connections, sessions, self.ready, self.halt, self.results)
        self.process = ctx.Process(target=_attacker, args=args, name=f"attack-{attack.name}", daemon=True)

    def start(self) -> None:
        self.process.start()
        if not self.ready.wait(120):
            raise RuntimeError(f"attack {self.attack.name}: its connections were not opened in 120 s")

    def stop(self) -> dict:
        """Close its connections; what it did: held_at_end, opened, failed, error."""
        self.halt.set()
        try:
            return self.results.get(timeout=60)
        finally:
            self.process.join(10)
            if self.process.is_alive():
                self.process.kill()
                self.process.join(5)
