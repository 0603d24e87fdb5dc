"""The ends `transport.py` measures, each with `push(...)` and `pull()`: a plain TCP socket, the
same bytes over gRPC, our wire format over gRPC, and a real `ddiloco synchronizer` on either plane.
Each server runs in a child process of its own, so that the client and the server do not share a
Python interpreter (as they do not in a run)."""

from __future__ import annotations

import socket
import ssl
import struct
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import torch
from safetensors.torch import save_file

from ddiloco.launch.procs import ProcessTable, ddiloco_command
from ddiloco.wire import auth, framing, quant, reassembly, rpc, sockets
from ddiloco.wire.buffers import BufferPool
from ddiloco.wire.protocol import signature

#: The plain servers' framing (one op byte, a little-endian u64 length), shared by the TCP and TLS
#: scripts: read exactly n bytes of the connection `conn` into `view`, then the loop's header.
RECEIVE_LOOP = r"""
def recv_exact(n):
    got = 0
    while got < n:
        k = conn.recv_into(view[got:n])
        if not k: raise SystemExit(0)
        got += k
while True:
    recv_exact(9)
    op, n = bytes(view[:1]), struct.unpack("<Q", view[1:9])[0]
"""

TCP_SERVER = (
    r"""
import socket, struct, sys, torch
torch.set_num_threads(1)
srv = socket.socket(); srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
srv.bind(("127.0.0.1", 0)); srv.listen(1); print(srv.getsockname()[1], flush=True)
conn, _ = srv.accept(); conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
numel = int(sys.argv[1]); buf = bytearray(4 * numel); view = memoryview(buf)
weights = torch.randn(numel)
"""
    + RECEIVE_LOOP
    + r"""    if op == b"P":  # a bf16 outer gradient arrives: decode it into a float32 tensor
        recv_exact(n)
        torch.frombuffer(view[:n], dtype=torch.bfloat16).to(torch.float32)
        conn.sendall(b"k")
    elif op == b"R":  # raw: the same bytes, no conversion
        recv_exact(n)
        conn.sendall(b"k")
    elif op == b"Q":  # raw: n bytes out of a buffer, no conversion
        conn.sendall(view[:n])
    else:  # send the float32 global value
        conn.sendall(memoryview(weights.numpy()).cast("B"))
"""
)

WIRE_SERVER = r"""
import sys, time, torch
torch.set_num_threads(1)
from ddiloco.wire import framing, reassembly, rpc
from ddiloco.wire.buffers import BufferPool
numel, chunk = int(sys.argv[1]), int(sys.argv[2])
weights = torch.randn(numel)
pool = BufferPool(4 * numel)
def push(frames, context):
    r = reassembly.Reassembler(1 << 40, pool=pool)
    for f in frames:
        m = r.feed(f)
    m.tensors({"w": (numel,)})
    return framing.message({"ok": True})
def fetch(request, context):
    yield from framing.tensor_frames({"kind": "fragment", "fragment": 0, "version": 0}, {"w": weights}, "fp32", chunk)
server = rpc.make_server({"Push": push, "Fetch": fetch}, chunk + rpc.FRAME_MARGIN, 8)
port = server.add_insecure_port("127.0.0.1:0"); server.start(); print(port, flush=True); time.sleep(3600)
"""

RAW_TLS_SERVER = (
    r"""
import socket, ssl, struct, sys
ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER); ctx.load_cert_chain(sys.argv[2], sys.argv[3])
srv = socket.socket(); srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
srv.bind(("127.0.0.1", 0)); srv.listen(1); print(srv.getsockname()[1], flush=True)
raw, _ = srv.accept(); raw.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
conn = ctx.wrap_socket(raw, server_side=True)
buf = bytearray(int(sys.argv[1])); view = memoryview(buf)
"""
    + RECEIVE_LOOP
    + r"""    if op == b"R":  # the same bytes in, no conversion
        recv_exact(n)
        conn.sendall(b"k")
    else:  # n bytes out of a buffer, no conversion
        conn.sendall(view[:n])
"""
)

GRPC_BYTES_SERVER = r"""
import sys, time
from ddiloco.wire import rpc
pull_bytes, chunk = int(sys.argv[1]), int(sys.argv[2])
blobs = [bytes(min(chunk, pull_bytes - i)) for i in range(0, pull_bytes, chunk)]
def push(frames, context):
    for f in frames:
        pass
    return b"k"
def fetch(request, context):
    yield from blobs
server = rpc.make_server({"Push": push, "Fetch": fetch}, chunk + rpc.FRAME_MARGIN, 8)
port = server.add_insecure_port("127.0.0.1:0"); server.start(); print(port, flush=True); time.sleep(3600)
"""


def local_address(procs: ProcessTable, name: str, cmd: list[str], tmp: Path) -> str:
    """The loopback address of a server `cmd` starts (it prints its port)."""
    return f"127.0.0.1:{_start_and_read_port(procs, name, cmd, tmp)}"


def _start_and_read_port(procs: ProcessTable, name: str, cmd: list[str], tmp: Path) -> int:
    out = tmp / f"{name}.out"
    child = procs.start(name, cmd, tmp / f"{name}.log", out)
    deadline = time.monotonic() + 60
    while not out.read_text().strip():
        if not child.alive() or time.monotonic() > deadline:
            raise RuntimeError(f"{name} did not start: {(tmp / f'{name}.log').read_text()[-2000:]}")
        time.sleep(0.02)
    return int(out.read_text().split()[0])


class Tcp:
    def __init__(self, procs: ProcessTable, numel: int, tmp: Path) -> None:
        port = _start_and_read_port(procs, "tcp", [sys.executable, "-c", TCP_SERVER, str(numel)], tmp)
        self.sock = socket.create_connection(("127.0.0.1", port))
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.numel = numel
        self.view = memoryview(bytearray(4 * numel))

    def push(self, grad: torch.Tensor) -> int:
        data = quant.get("bf16").encode(grad)
        self.sock.sendall(b"P" + struct.pack("<Q", len(data)))
        self.sock.sendall(data)
        if self.sock.recv(1) != b"k":
            raise ConnectionError("the TCP baseline server went away")
        return len(data)

    def pull(self) -> int:
        n = 4 * self.numel
        self.sock.sendall(b"G" + struct.pack("<Q", n))
        got = 0
        while got < n:
            k = self.sock.recv_into(self.view[got:n])
            if not k:
                raise ConnectionError("the TCP baseline server went away")
            got += k
        torch.frombuffer(self.view[:n], dtype=torch.float32).clone()
        return n


class Raw:
    """The physical limit: the same byte counts over the same kind of socket, no conversion, no copies."""

    def __init__(self, tcp: Tcp, push_bytes: int, pull_bytes: int) -> None:
        self.tcp, self.push_bytes, self.pull_bytes = tcp, push_bytes, pull_bytes
        self.data = memoryview(bytearray(push_bytes))

    def push(self, grad: torch.Tensor) -> int:
        self.tcp.sock.sendall(b"R" + struct.pack("<Q", self.push_bytes))
        self.tcp.sock.sendall(self.data)
        if self.tcp.sock.recv(1) != b"k":
            raise ConnectionError("the TCP baseline server went away")
        return self.push_bytes

    def pull(self) -> int:
        n = self.pull_bytes
        self.tcp.sock.sendall(b"Q" + struct.pack("<Q", n))
        got = 0
        while got < n:
            k = self.tcp.sock.recv_into(self.tcp.view[got:n])
            if not k:
                raise ConnectionError("the TCP baseline server went away")
            got += k
        return n


def self_signed(folder: Path) -> tuple[Path, Path]:
    """A certificate for 127.0.0.1, its own CA, and its key (`openssl`), for the TLS paths."""
    cert, key = folder / "cert.pem", folder / "key.pem"
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", str(key), "-out", str(cert)]
        + ["-days", "1", "-subj", "/CN=ddiloco-bench", "-addext", "subjectAltName=IP:127.0.0.1"],
        check=True,
        capture_output=True,
        timeout=60,
    )
    return cert, key


class RawTls(Raw):
    """The limit under TLS: the same byte counts over one TLS connection, no conversion, no copies
    beyond TLS's own."""

    def __init__(self, procs: ProcessTable, tmp: Path, cert: Path, key: Path, push_bytes: int, pull_bytes: int) -> None:
        cmd = [sys.executable, "-c", RAW_TLS_SERVER, str(max(push_bytes, pull_bytes) + 16), str(cert), str(key)]
        port = _start_and_read_port(procs, "raw-tls", cmd, tmp)
        sock = socket.create_connection(("127.0.0.1", port))
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        tls = ssl.create_default_context(cafile=str(cert)).wrap_socket(sock, server_hostname="127.0.0.1")
        self.tcp = SimpleNamespace(sock=tls, view=memoryview(bytearray(pull_bytes)))  # type: ignore[assignment]
        self.push_bytes, self.pull_bytes = push_bytes, pull_bytes
        self.data = memoryview(bytearray(push_bytes))


class RawConverting(Raw):
    """The limit for a sender of bf16 values it holds in float32, as a learner's push is: a raw
    connection (`Raw` or `RawTls`, shared, used in turn), each chunk converted into one scratch
    buffer just before it is sent, nothing else. Where the two ends share the machine's cores (here,
    on loopback) the conversion's time adds to the push's rather than hiding behind the wire."""

    def __init__(self, raw: Raw, chunk: int) -> None:
        self.tcp, self.push_bytes, self.pull_bytes = raw.tcp, raw.push_bytes, raw.pull_bytes
        self.per_chunk = chunk // 2
        self.scratch = torch.empty(self.per_chunk, dtype=torch.bfloat16)
        self.scratch_bytes = memoryview(self.scratch.view(torch.uint8).numpy())

    def push(self, grad: torch.Tensor) -> int:
        self.tcp.sock.sendall(b"R" + struct.pack("<Q", 2 * grad.numel()))
        for start in range(0, grad.numel(), self.per_chunk):
            part = grad[start : start + self.per_chunk]
            self.scratch[: part.numel()].copy_(part)
            self.tcp.sock.sendall(self.scratch_bytes[: 2 * part.numel()])
        if self.tcp.sock.recv(1) != b"k":
            raise ConnectionError("the baseline server went away")
        return 2 * grad.numel()


class GrpcBytes:
    """gRPC's own ceiling: the same byte counts in messages of one chunk each, through the same server
    and channel options, with no framing, no conversion and no decode on either side."""

    def __init__(self, address: str, push_bytes: int, chunk: int) -> None:
        self.bulk = rpc.Stubs(rpc.open_channel(address, "bulk", chunk + rpc.FRAME_MARGIN), None)
        self.blobs = [bytes(min(chunk, push_bytes - i)) for i in range(0, push_bytes, chunk)]

    def push(self, grad: torch.Tensor) -> int:
        if self.bulk.push(iter(self.blobs), timeout=300) != b"k":
            raise RuntimeError("the gRPC bytes server did not answer")
        return sum(len(b) for b in self.blobs)

    def pull(self) -> int:
        return sum(len(b) for b in self.bulk.fetch(b"", timeout=300))


class Ours:
    """Push and pull through our wire format and gRPC (a minimal server, or the real synchronizer)."""

    def __init__(
        self,
        address: str,
        numel: int,
        chunk: int,
        learner_sessions: list[str] | None = None,
        credentials: auth.Tls | None = None,
    ) -> None:
        max_frame = chunk + rpc.FRAME_MARGIN
        self.control = rpc.Stubs(rpc.open_channel(address, "control", max_frame, credentials), None)
        self.bulk = rpc.Stubs(rpc.open_channel(address, "bulk", max_frame, credentials), None)
        self.credentials = credentials
        self.numel, self.chunk = numel, chunk
        self.sessions = learner_sessions or ["-"]
        self.arrivals = BufferPool(8 * numel)  # as a learner's link receives (`wire.buffers`)

    def head(self) -> dict:
        return {
            "kind": "contribution",
            "session": self.sessions[0],
            "fragment": 0,
            "base_version": 0,
            "steps": 1,
            "tokens": 1,
            "seconds": 0.1,
            "step_time": 0.1,
            "step": 1,
            "position": 1,
        }

    def push(self, grad: torch.Tensor) -> int:
        head = self.head()
        frames = framing.Counted(framing.iter_tensor_frames(head, {"w": grad}, "bf16", self.chunk))  # as a learner
        reply = framing.read_message(self.bulk.push(frames, timeout=300))
        if not (reply.get("ok") or "duplicate" in reply.get("reason", "")):
            raise RuntimeError(f"push refused: {reply}")
        return frames.nbytes

    def pull(self) -> int:
        nbytes, got = 0, {}
        r = reassembly.Reassembler(1 << 40, pool=self.arrivals)
        for frame in self.bulk.fetch(framing.message({}), timeout=300):
            nbytes += len(frame)
            msg = r.feed(frame)
            if msg is not None:
                got.update(msg.tensors({"w": (self.numel,)}))
        assert got["w"].shape == (self.numel,)
        return nbytes

    def keep_alive(self) -> None:
        for s in self.sessions[1:] + self.sessions[:1]:
            if s != "-":
                self.control.call("Heartbeat", framing.message({"session": s}), 30)


class OursSocket(Ours):
    """The same through the synchronizer's bulk socket plane (its default, `wire.sockets`)."""

    def __init__(self, ours: Ours, host: str, port: int) -> None:
        self.__dict__.update(ours.__dict__)
        self.client = sockets.BulkSocketClient(
            host, port, None, self.chunk + rpc.FRAME_MARGIN, auth.ssl_part(self.credentials)
        )

    def push(self, grad: torch.Tensor) -> int:
        head = self.head()
        reply, sent = self.client.push(framing.iter_frame_parts(head, {"w": grad}, "bf16", self.chunk), 300)
        if not (reply.get("ok") or "duplicate" in reply.get("reason", "")):
            raise RuntimeError(f"push refused: {reply}")
        return sent

    def pull(self) -> int:
        got = {}
        for msg in self.client.fetch(300, self.arrivals, session=self.sessions[0]):
            got.update(msg.tensors({"w": (self.numel,)}))
        assert got["w"].shape == (self.numel,)
        return 4 * self.numel


def start_service(
    procs: ProcessTable,
    tmp: Path,
    numel: int,
    chunk: int,
    bulk_socket: bool = False,
    tls: tuple[Path, Path] | None = None,
) -> Ours:
    """A real synchronizer and two registered sessions; `tls`: its certificate and key (both planes)."""
    cmd = ddiloco_command(
        "synchronizer",
        "--port",
        "0",
        "--address-file",
        str(tmp / "address"),
        "--init",
        str(tmp / "init.safetensors"),
        "--fragments",
        "1",
        "--sync-every",
        "2",
        "--overlap",
        "1",
        "--quorum",
        "2",
        "--learners",
        "2",
        "--heartbeat",
        "5",
        "--chunk-bytes",
        str(chunk),
        "--checkpoint-every",
        "0",
        "--log-level",
        "error",
    )
    if tls is not None:
        cmd += ["--tls-cert", str(tls[0]), "--tls-key", str(tls[1])]
    name = ("sync-socket" if bulk_socket else "sync") + ("-tls" if tls is not None else "")
    tmp = tmp / name
    tmp.mkdir()
    save_file({"w": torch.randn(numel)}, str(tmp / "init.safetensors"))
    cmd[cmd.index("--address-file") + 1] = str(tmp / "address")
    cmd[cmd.index("--init") + 1] = str(tmp / "init.safetensors")
    child = procs.start(name, cmd, tmp / "sync.log")
    deadline = time.monotonic() + 120
    while not (tmp / "address").is_file():
        if not child.alive() or time.monotonic() > deadline:
            raise RuntimeError(f"the synchronizer did not start: {(tmp / 'sync.log').read_text()[-2000:]}")
        time.sleep(0.05)
    address = (tmp / "address").read_text().strip()
    credentials = auth.channel_credentials(tls[0]) if tls is not None else None
    probe = Ours(address, numel, chunk, credentials=credentials)
    sig = signature({"w": torch.empty(numel)})
    replies = [
        framing.read_message(
            probe.control.call(
                "Register",
                framing.message({"learner": m, "incarnation": f"bench{m}", "signature": sig, "fresh": True}),
                30,
            )
        )
        for m in range(2)
    ]
    sessions = [r["session"] for r in replies]
    ours = Ours(address, numel, chunk, sessions, credentials)  # a quorum of 2 is never reached by one
    return OursSocket(ours, "127.0.0.1", replies[0]["bulk_port"]) if bulk_socket else ours
