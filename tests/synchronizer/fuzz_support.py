"""What the fuzz suites of the planes share (#32, #46): a live synchronizer on loopback with its
probes (Status, the parameters' hash, an honest push that must be merged), Hypothesis settings sized
for the default suite (a campaign by `DDILOCO_FUZZ_CASES`), and the log bytes a test caused, against
the rate limits' budget."""

from __future__ import annotations

import contextlib
import logging
import os
import threading
import time
from collections.abc import Iterator

import grpc
import torch
from hypothesis import HealthCheck, Phase, settings

from ddiloco.core import AlgorithmConfig
from ddiloco.synchronizer.server import SynchronizerServer, build_service
from ddiloco.synchronizer.settings import ServiceSettings
from ddiloco.wire import framing, sockets
from ddiloco.wire.protocol import signature
from ddiloco.wire.timeouts import Timeouts

from ..support.heads import contribution_head, params_digest
from ..support.runtime import RawClient

# Cases per property: enough that the hostile framing headers include #46's 12-byte hello (see
# support/hostile_frames.py), few enough for the default suite; DDILOCO_FUZZ_CASES=1000 for a campaign.
CASES = int(os.environ.get("DDILOCO_FUZZ_CASES", "200"))
TOKEN = "tok"
NUMEL = 4096
PARAMS = {"w": torch.zeros(NUMEL), "b": torch.ones(3)}
# K = 1, no grace: an accepted contribution merges at once, never later behind our back
ALGORITHM = AlgorithmConfig(fragments=1, sync_every=4, overlap=1, quorum=1, grace=0.0, merge="mean")
HONEST_PUSH_SECONDS = 30.0  # the bound within which an honest push is merged, attack or not (a loaded machine)

# The lines a client can make a synchronizer (and its dashboard) write, per the rate limits on them:
# refused calls (a burst of 20, then 5/s; a line saying how many were held back may come with each),
# the bulk socket greeter's (5, then 0.2/s), the dashboard's (20, then 5/s), and a few lines of the
# service's own life (registrations, merges). A line is at most
# LINE_BYTES: a refusal's method is cut to 64 characters and its reason to 300.
LOG_BURST, LOG_PER_SECOND, LOG_OWN_LINES, LINE_BYTES = 2 * 20 + 5 + 20, 2 * 5 + 0.2 + 5, 40, 600


def log_budget(seconds: float) -> int:
    """The most lines the rate limits let clients cause in `seconds` (each at most LINE_BYTES)."""
    return int(LOG_BURST + LOG_PER_SECOND * seconds + LOG_OWN_LINES)


class Plane:
    """A live synchronizer (token or none, bulk socket) and what a test needs to probe it."""

    def __init__(self, service, server, address, token: str | None = TOKEN):
        self.service, self.server, self.address, self.token = service, server, address, token
        self.client = RawClient(address, token)
        self.sig = signature(PARAMS)
        self.sessions = [self.client.register(m, self.sig, f"fuzz{m}")["session"] for m in range(2)]
        self.port = server.handlers.bulk_port

    def digest(self) -> str:
        return params_digest(self.service)

    def alive(self) -> None:
        """Status answers, over gRPC, within the control deadline of a loaded machine."""
        assert "merges" in self.client.call("Status", {}, timeout=10)

    def version(self) -> int:
        with self.service.lock:
            return self.service.core.versions[0]

    def honest_push(self, fallback: bool = True) -> None:
        """A well-formed contribution on the bulk socket, accepted and merged within
        `HONEST_PUSH_SECONDS` (with `fallback`, on gRPC if the socket has no room for it, as a learner
        falls back; without, the socket itself must take it)."""
        started = time.monotonic()
        version = self.version()
        head = contribution_head(self.sessions[0], version)
        grads = {"w": torch.full((NUMEL,), -0.5), "b": torch.zeros(3)}
        client = sockets.BulkSocketClient("127.0.0.1", self.port, self.token, 1 << 21)
        try:
            reply, _ = client.push(framing.iter_frame_parts(head, grads, "bf16"), 30)
        except sockets.SocketRpcError as exc:
            assert fallback, f"the bulk socket refused an honest push: {exc}"
            assert exc.code() in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.RESOURCE_EXHAUSTED), exc
            reply = self.client.push_frames(framing.tensor_frames(head, grads, "bf16"), 30)
        assert reply.get("ok") is True, reply
        while self.version() == version:  # merged (K = 1): later refusals are measured against it
            assert time.monotonic() - started < HONEST_PUSH_SECONDS, "the honest push was not merged in time"
            time.sleep(0.01)


@contextlib.contextmanager
def live_plane(token: str | None = TOKEN) -> Iterator[Plane]:
    """A synchronizer with the bulk socket (and `token`, None for an open one), two registered
    sessions kept alive by heartbeats (as learners send them), stopped at the end."""
    service = build_service(
        {n: t.clone() for n, t in PARAMS.items()},
        ALGORITHM,
        ServiceSettings(timeouts=Timeouts.derive(0.5), max_learners=4, max_message_bytes=1 << 20, tokens=10**12),
    )
    server = SynchronizerServer(service, "127.0.0.1", 0, token, bulk_socket=True)
    address = server.start()
    done = threading.Event()

    def keep_alive():
        while not done.wait(0.25):
            with service.lock:
                ids = [s.id for s in service.sessions]
            for sid in ids:
                service.membership.heartbeat(sid, {"step": 8, "tokens": 64, "state": "training"})

    keeper = threading.Thread(target=keep_alive, daemon=True)
    keeper.start()
    try:
        yield Plane(service, server, address, token)
    finally:
        done.set()
        keeper.join(5)
        server.stop(grace=0.2)


def fuzz(cases: int = CASES):
    """Hypothesis settings for a live plane: derandomized (the same cases in every run) and without
    shrinking, which against one live process that a case may have broken only repeats the failure,
    each time after the bound the case waits out."""
    return settings(
        max_examples=cases,
        deadline=None,
        derandomize=True,
        phases=[Phase.explicit, Phase.generate],
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.function_scoped_fixture],
    )


def fds() -> int:
    return len(os.listdir("/proc/self/fd"))


class LogBytes(logging.Handler):
    """The lines the package's loggers write at INFO and above (a service's default level), formatted as
    `records.logsetup` formats them, tracebacks included: what would reach a log file."""

    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.setFormatter(logging.Formatter("%(asctime)s synchronizer %(levelname)s %(name)s: %(message)s"))
        self.bytes = self.lines = self.tracebacks = 0
        self.started = time.monotonic()

    def emit(self, record: logging.LogRecord) -> None:
        text = self.format(record)
        self.bytes += len(text.encode()) + 1
        self.lines += 1
        self.tracebacks += "Traceback (most recent call last)" in text

    def check(self, why: str = "") -> None:
        """No traceback, and no more lines (nor bytes) than the rate limits allow for the time so far."""
        lines = log_budget(time.monotonic() - self.started)
        assert self.tracebacks == 0, f"{self.tracebacks} tracebacks logged {why}"
        assert self.lines <= lines, f"{self.lines} lines logged > the budget of {lines} {why}"
        assert self.bytes <= lines * LINE_BYTES, f"{self.bytes} bytes logged > {lines} lines of {LINE_BYTES} {why}"


@contextlib.contextmanager
def counting_logs() -> Iterator[LogBytes]:
    """Count what the `ddiloco` loggers write meanwhile (their level set to INFO, then restored)."""
    logger = logging.getLogger("ddiloco")
    level, handler = logger.level, LogBytes()
    logger.setLevel(logging.INFO)
    logger.addHandler(handler)
    try:
        yield handler
    finally:
        logger.removeHandler(handler)
        logger.setLevel(level)
