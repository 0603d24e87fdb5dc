"""Fuzzing the planes added after the gRPC one (#32): the bulk socket (random bytes, lying hellos and
frames, silent and trickling connections) and the donation RPCs of peer recovery (`Donor`, `Donate`,
`Recover`), against a live synchronizer on loopback. Whatever arrives: Status still answers, no handler
raises (no UNKNOWN status, no INTERNAL error reply), refused input leaves the global parameters'
hash unchanged, an honest push is accepted during the attack, and threads and descriptors stay
bounded. A fast run by default; `-m slow` runs the long campaign."""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import socket
import struct
import threading
import time

import grpc
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ddiloco.core import AlgorithmConfig
from ddiloco.synchronizer import bulk_greeting
from ddiloco.synchronizer.bulk_socket import MAX_FETCHING
from ddiloco.synchronizer.server import SynchronizerServer, build_service
from ddiloco.synchronizer.settings import ServiceSettings
from ddiloco.wire import framing, sockets
from ddiloco.wire.protocol import signature
from ddiloco.wire.timeouts import Timeouts

from ..support.runtime import RawClient

pytestmark = pytest.mark.timeout(600)

FAST_CASES, SLOW_CASES = 25, 1000
TOKEN = "tok"
NUMEL = 4096
PARAMS = {"w": torch.zeros(NUMEL), "b": torch.ones(3)}
# K = 1, no grace: an accepted contribution merges at once, never later behind our back
ALGORITHM = AlgorithmConfig(fragments=1, sync_every=4, overlap=1, quorum=1, grace=0.0, merge="mean")
# a hello's length (60 000 bytes, within the limit) and a good prefix: all that follows may be JSON
ENDLESS_HELLO = struct.pack("<I3sBI", 60_000, framing.MAGIC, framing.PROTOCOL_VERSION, 60_000 - framing.PREFIX_BYTES)
ERROR_CODES = {c.name for c in grpc.StatusCode} - {"OK", "UNKNOWN", "INTERNAL"}

json_values = st.sampled_from([0, -1, 2**63, 10**400, 1e308, float("nan"), "", "x" * 5000, True, None, [], {}]) | (
    st.recursive(
        st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=50),
        lambda c: st.lists(c, max_size=4) | st.dictionaries(st.text(max_size=8), c, max_size=4),
        max_leaves=10,
    )
)


class Plane:
    """A live synchronizer (token, bulk socket) and what a test needs to probe it."""

    def __init__(self, service, server, address):
        self.service, self.server, self.address = service, server, address
        self.client = RawClient(address, TOKEN)
        self.sig = signature(PARAMS)
        self.sessions = [self.client.register(m, self.sig, f"fuzz{m}")["session"] for m in range(2)]
        self.port = server.handlers.bulk_port

    def digest(self) -> str:
        h = hashlib.sha256()
        with self.service.lock:
            for name in sorted(self.service.core.params):
                h.update(self.service.core.params[name].numpy().tobytes())
        return h.hexdigest()

    def alive(self) -> None:
        assert "merges" in self.client.call("Status", {}, timeout=10)

    def version(self) -> int:
        with self.service.lock:
            return self.service.core.versions[0]

    def honest_push(self) -> None:
        """A well-formed contribution on the bulk socket, accepted and merged (on gRPC if the socket has
        no room for it, as a learner falls back)."""
        version = self.version()
        head = contribution_head(self.sessions[0], version)
        grads = {"w": torch.full((NUMEL,), -0.5), "b": torch.zeros(3)}
        client = sockets.BulkSocketClient("127.0.0.1", self.port, TOKEN, 1 << 21)
        try:
            reply, _ = client.push(framing.iter_frame_parts(head, grads, "bf16"), 30)
        except sockets.SocketRpcError as exc:
            assert exc.code() in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.RESOURCE_EXHAUSTED), exc
            reply = self.client.push_frames(framing.tensor_frames(head, grads, "bf16"), 30)
        assert reply.get("ok") is True, reply
        deadline = time.monotonic() + 30
        while self.version() == version:  # merged (K = 1): later refusals are measured against it
            assert time.monotonic() < deadline, "the honest push was not merged"
            time.sleep(0.01)


def contribution_head(session, version):
    return {
        "kind": "contribution",
        "session": session,
        "fragment": 0,
        "base_version": version,
        "steps": 4,
        "tokens": 64,
        "seconds": 0.1,
        "step_time": 0.025,
        "step": 4 * (version + 1),
        "position": 4 * (version + 1),
    }


@pytest.fixture(scope="module")
def plane():
    service = build_service(
        {n: t.clone() for n, t in PARAMS.items()},
        ALGORITHM,
        ServiceSettings(timeouts=Timeouts.derive(0.5), max_learners=4, max_message_bytes=1 << 20, tokens=10**12),
    )
    server = SynchronizerServer(service, "127.0.0.1", 0, TOKEN, bulk_socket=True)
    address = server.start()
    done = threading.Event()

    def keep_alive():  # heartbeats for every session, as learners send them
        while not done.wait(0.25):
            with service.lock:
                ids = [s.id for s in service.sessions]
            for sid in ids:
                service.heartbeat(sid, {"step": 8, "tokens": 64, "state": "training"})

    keeper = threading.Thread(target=keep_alive, daemon=True)
    keeper.start()
    try:
        yield Plane(service, server, address)
    finally:
        done.set()
        keeper.join(5)
        server.stop(grace=0.2)


def fuzz(cases: int):
    return settings(
        max_examples=cases,
        deadline=None,
        derandomize=True,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.function_scoped_fixture],
    )


def campaign(test):
    """The same property twice: a fast default run and a long `slow` campaign."""
    sizes = [pytest.param(FAST_CASES, id="fast"), pytest.param(SLOW_CASES, id="campaign", marks=pytest.mark.slow)]
    return pytest.mark.parametrize("size", sizes)(test)


def small(head: dict) -> bytes:
    return sockets.small_bytes(head)


def framed(frame: bytes) -> bytes:
    return struct.pack("<I", len(frame)) + frame


def exchange(port: int, data: bytes) -> bytes:
    """Send `data` on a new bulk socket connection and close the sending side; what the synchronizer
    sent back until it closed (bounded in bytes and time)."""
    got = bytearray()
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        with contextlib.suppress(OSError):
            sock.sendall(data)
            sock.shutdown(socket.SHUT_WR)
        with contextlib.suppress(OSError):
            for _ in range(10_000):
                chunk = sock.recv(1 << 16)
                if not chunk:
                    break
                got += chunk
    return bytes(got)


def check_answer(data: bytes) -> dict | None:
    """The synchronizer's first message, if it sent one: a well-formed frame, and an error that names
    a status other than a handler's crash."""
    if len(data) < 4:
        return None
    (n,) = struct.unpack("<I", data[:4])
    if len(data) < 4 + n:
        return None  # cut short by the close (a fetch's frames, say)
    frame, _ = framing.unpack_frame(data[4 : 4 + n])
    head = frame.get("head")
    assert isinstance(head, dict), frame
    if "error" in head:
        assert head["error"] in ERROR_CODES, head
    return head


def check(plane: Plane, data: bytes) -> None:
    """Send `data`; if the synchronizer took no contribution from it, the global model is unchanged."""
    before, accepted, version = plane.digest(), plane.service.status()["contributions"], plane.version()
    check_answer(exchange(plane.port, data))
    if plane.service.status()["contributions"] == accepted:
        assert plane.digest() == before
    else:  # the fuzzer made a valid contribution: let its merge (K = 1) finish before the next case
        deadline = time.monotonic() + 10
        while plane.version() == version:
            assert time.monotonic() < deadline
            time.sleep(0.01)
    plane.alive()


@campaign
def test_random_bytes_on_the_bulk_socket(plane, size):
    @fuzz(size)
    @given(st.binary(max_size=3000), st.sampled_from(["raw", "length", "hello"]))
    def run(data, shape):
        if shape == "length":  # a plausible length, then anything
            data = framed(data)
        elif shape == "hello":  # a good hello, then anything
            data = small({"method": "Push", "token": TOKEN}) + data
        check(plane, data)

    run()
    plane.honest_push()


@campaign
def test_lying_hellos(plane, size):
    @fuzz(size)
    @given(
        st.sampled_from(["Push", "Fetch", "Donate", "", None]) | json_values,
        st.sampled_from([TOKEN, "wrong", None]) | json_values,
        st.sampled_from(["live", None]) | json_values,
        st.binary(max_size=200),
    )
    def run(method, token, session, rest):
        hello = {"method": method, "token": token}
        if session is not None:
            hello["session"] = plane.sessions[1] if session == "live" else session
        try:
            data = small(hello)
        except ValueError:  # not JSON (NaN and the like are; 10**400 is too, but not back): skip
            return
        check(plane, data + rest)

    run()
    plane.honest_push()


@campaign
def test_lying_push_frames(plane, size):
    """A good hello, then a contribution's frames with one header field (of the frame or of its message
    head) replaced, or a frame length that lies, or the frames cut short."""
    grads = {"w": torch.zeros(NUMEL), "b": torch.zeros(3)}

    @fuzz(size)
    @given(
        st.sampled_from(["frame", "head", "length", "cut"]),
        st.sampled_from(["msg", "part", "parts", "nbytes", "specs", "offset", "head", "session", "fragment", "kind"]),
        json_values,
        st.integers(min_value=0, max_value=(1 << 32) - 1),
    )
    def run(where, key, value, number):
        frames = framing.tensor_frames(contribution_head(plane.sessions[1], 0), grads, "bf16", 4096)
        first, body = framing.unpack_frame(frames[0])
        if where == "frame":
            first[key] = value
        elif where == "head":
            first["head"][key] = value
        try:
            frames[0] = framing.pack_frame(first, body)
        except ValueError:
            return
        hello = small({"method": "Push", "token": TOKEN})
        data = hello + b"".join(framed(f) for f in frames)
        if where == "length":  # the first frame's
            data = hello + struct.pack("<I", number) + data[len(hello) + 4 :]
        elif where == "cut":
            data = data[: number % len(data)]
        check(plane, data)

    run()
    plane.honest_push()


@campaign
def test_the_donation_rpcs(plane, size):
    """Donor, Donate and Recover with hostile heads and frames: refused or answered, never raised."""
    client = plane.client

    def call(method, payload):
        try:
            if method == "Donate":
                framing.read_message(client.stubs.donate(iter(payload), timeout=10, metadata=client.stubs.metadata))
            elif method == "Recover":
                list(client.stubs.recover(payload, timeout=10, metadata=client.stubs.metadata))
            else:
                framing.read_message(client.stubs.call(method, payload, 10))
        except grpc.RpcError as exc:
            assert exc.code() not in (grpc.StatusCode.UNKNOWN, grpc.StatusCode.INTERNAL), exc.details()

    @fuzz(size)
    @given(
        st.sampled_from(["Donor", "Donate", "Recover"]),
        st.sampled_from(["ask", "poll"]) | json_values,
        st.sampled_from(["live", "ticket"]) | json_values,
        st.sampled_from(["heads", "bytes"]),
        st.binary(max_size=500),
    )
    def run(method, op, ticket, shape, raw):
        before = plane.digest()
        session = plane.sessions[1]
        if ticket == "ticket":  # a ticket this session really holds
            got = client.call("Donor", {"session": plane.sessions[0], "op": "ask"}, timeout=10)
            ticket = got.get("ticket")
        head = {"session": session, "op": op, "ticket": ticket, "kind": "inner_state", "scalars": op, "checksum": ""}
        try:
            message = framing.message(head)
        except ValueError:
            return
        if shape == "bytes":
            call(method, [raw] if method == "Donate" else raw)
        elif method == "Donate":
            tensors = {"w/exp_avg": torch.zeros(NUMEL), "x/../../y": torch.zeros(2)}
            call(method, framing.tensor_frames(head, tensors, "fp32", 1024) + [raw])
        else:
            call(method, message)
        assert plane.digest() == before  # peer recovery never moves parameters
        summary = plane.service.donations.summary()
        assert summary["tickets"] <= 4 and len(json.dumps(summary)) < 10_000
        plane.alive()

    run()
    plane.honest_push()


def _fds() -> int:
    return len(os.listdir("/proc/self/fd"))


def test_resource_attacks_leave_status_and_honest_pushes_working_with_bounded_threads_and_descriptors(plane):
    """Silent and trickling pre-auth connections, refused pushes that keep trickling and unread fetches,
    all at once (fewer than #32's numbers, the same kinds): Status answers, an honest push is merged,
    the synchronizer holds at most its caps' worth of descriptors and no thread per connection, and
    everything is given back once the attackers hang up."""
    plane.honest_push()  # threads that start on first use are running before the count
    threads0, fds0 = threading.active_count(), _fds()
    socks: list[socket.socket] = []

    def connect(first: bytes = b"") -> None:
        try:
            s = socket.create_connection(("127.0.0.1", plane.port), timeout=5)
        except OSError:
            return
        socks.append(s)
        with contextlib.suppress(OSError):
            s.sendall(first)

    try:
        for _ in range(40):
            connect()  # silent
        for _ in range(40):
            connect(ENDLESS_HELLO)  # a hello that never ends
        for _ in range(10):
            connect(small({"method": "Push", "token": TOKEN}) + b"x" * 64)  # refused, then trickles
        for i in range(4):
            connect(small({"method": "Fetch", "token": TOKEN, "session": plane.sessions[i % 2]}))  # never read
        halt = threading.Event()

        def trickle():
            while not halt.wait(0.1):
                for s in socks[40:90]:
                    with contextlib.suppress(OSError):
                        s.send(b" ")

        trickler = threading.Thread(target=trickle, daemon=True)
        trickler.start()
        try:
            time.sleep(0.5)
            plane.alive()
            before = plane.digest()
            plane.honest_push()
            assert plane.digest() != before
            held_by_server = _fds() - fds0 - len(socks)
            assert held_by_server <= bulk_greeting.MAX_WAITING + MAX_FETCHING + 16, held_by_server
            # not one per connection (94 here): the trickler, the fetches and a few of gRPC's
            assert threading.active_count() - threads0 <= 24, threading.active_count() - threads0
        finally:
            halt.set()
            trickler.join(5)
    finally:
        for s in socks:
            s.close()
    deadline = time.monotonic() + 30
    while plane.server.bulk.greeter.waiting or threading.active_count() > threads0 + 2 or _fds() > fds0 + 4:
        assert time.monotonic() < deadline, (threading.active_count(), threads0, _fds(), fds0)
        time.sleep(0.05)
    plane.alive()
