"""Builders shared by the runtime's tests: an in-process synchronizer on loopback, learner threads,
and a raw client that can send anything (for the bad-input tests)."""

from __future__ import annotations

import threading
import time
from contextlib import contextmanager

import grpc
import torch

from ddiloco.core import AlgorithmConfig
from ddiloco.learner.client import LearnerClient
from ddiloco.synchronizer.server import SynchronizerServer, build_service
from ddiloco.synchronizer.settings import ServiceSettings
from ddiloco.train.inner import InnerConfig, inner_step, make_inner_optimizer
from ddiloco.wire import framing, rpc
from ddiloco.wire.timeouts import Timeouts

FAST = Timeouts.derive(0.1)
ALGORITHM = AlgorithmConfig(fragments=2, sync_every=4, overlap=2, quorum=1, grace=0.5)


@contextmanager
def mlp_run(width: int = 16, bulk_socket: bool = True, arrival: str = "rebase", **settings):
    """A small MLP, an in-process synchronizer of it (2 fragments, H = 4) and a client of that model."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, width), torch.nn.ReLU(), torch.nn.Linear(width, 1))
    params = {n: p.detach().clone() for n, p in model.named_parameters()}
    service = build_service(
        params,
        AlgorithmConfig(fragments=2, sync_every=4, overlap=1, arrival=arrival),
        ServiceSettings(timeouts=FAST, tokens=10**9, **settings),
    )
    server = SynchronizerServer(service, bulk_socket=bulk_socket)
    address = server.start()
    service.server = server  # for tests that look at the server's planes
    try:
        with LearnerClient(model, address, learner_id=0, timeouts=FAST, report_every=1e9) as client:
            yield service, client, model
    finally:
        server.stop(grace=0.2)


def train_until_accepted(client: LearnerClient, model: torch.nn.Module, accepted: int, seconds: float = 30) -> int:
    """Train until the synchronizer accepted this many contributions (bounded in steps and time)."""
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-2)
    deadline = time.monotonic() + seconds
    for step in range(20_000):
        if step % 20 == 0 and (client.stats()["accepted"] >= accepted or time.monotonic() > deadline):
            break
        x = torch.randn(16, 8)
        model(x).pow(2).mean().backward()
        optimizer.step()
        optimizer.zero_grad()
        client.step(tokens=16)
    return client.stats()["accepted"]


@contextmanager
def synchronizer(task, tmp_path=None, algorithm=ALGORITHM, token=None, bulk_socket=True, **settings):
    params = {n: p.detach() for n, p in task.build_model(0).named_parameters()}
    settings.setdefault("timeouts", FAST)
    service = build_service(
        params,
        algorithm,
        ServiceSettings(**settings),
        task.embedding_names,
        checkpoint_dir=tmp_path / "ckpt" if tmp_path is not None else None,
        event_log=tmp_path / "events.jsonl" if tmp_path is not None else None,
    )
    server = SynchronizerServer(service, "127.0.0.1", 0, token, bulk_socket=bulk_socket)
    address = server.start()
    try:
        yield service, address
    finally:
        server.stop(grace=0.2)


class LearnerThread(threading.Thread):
    """A learner training the task in a thread until the synchronizer stops it (or `steps`)."""

    def __init__(self, task, address, learner, learners=2, steps=10_000, step_delay=0.0, seed=None, **kw):
        super().__init__(daemon=True)
        self.task, self.address, self.learner, self.learners = task, address, learner, learners
        self.steps, self.step_delay, self.kw = steps, step_delay, kw
        self.model = task.build_model(100 + learner if seed is None else seed)
        self.client = LearnerClient(self.model, address, learner, timeouts=FAST, **kw)
        self.result, self.error, self.start_position = None, None, None
        self.joined = threading.Event()
        self.halt = threading.Event()

    def links_measured(self) -> bool:
        """Each link has timed a push and a heartbeat (`learner.overlap.LinkTime`)."""
        links = self.client.links
        return bool(links) and all(link.link_time.push.value is not None for link in links)

    def run(self):
        try:
            opt = make_inner_optimizer(self.model, InnerConfig(batch_size=4))
            self.start_position = self.client.start()
            self.joined.set()
            stream = self.task.stream(self.learner, self.learners, 4, 0)
            stream.seek(self.start_position)
            n = 0
            while not self.client.stopping and n < self.steps and not self.halt.is_set():
                batch = stream.next()
                inner_step(self.model, opt, self.task.loss(self.model, batch), 1.0)
                if self.step_delay:
                    time.sleep(self.step_delay)
                self.client.step(batch.tokens, position=stream.position)
                n += 1
            self.result = self.client.finish(timeout=5.0)
        except BaseException as exc:  # surfaced by the test
            self.error = exc
            self.client.close()


def wait_for(condition, timeout=30.0, interval=0.05, message="condition"):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = condition()
        if value:
            return value
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout} s waiting for {message}")


class RawClient:
    """Speaks the protocol by hand, so a test can send what no well-behaved learner would."""

    def __init__(self, address, token=None):
        self.channel = rpc.open_channel(address, "raw", framing.DEFAULT_CHUNK_BYTES + rpc.FRAME_MARGIN)
        self.stubs = rpc.Stubs(self.channel, token)

    def call(self, method, head, timeout=5.0):
        return framing.read_message(self.stubs.call(method, framing.message(head), timeout))

    def register(self, learner, signature, incarnation="raw"):
        return self.call(
            "Register", {"learner": learner, "incarnation": incarnation, "signature": signature, "fresh": True}
        )

    def push_frames(self, frames, timeout=10.0):
        return framing.read_message(self.stubs.push(iter(frames), timeout=timeout, metadata=self.stubs.metadata))

    def contribution(self, session, fragment, tensors, codec="fp32", **fields):
        head = {
            "kind": "contribution",
            "session": session,
            "fragment": fragment,
            "base_version": 0,
            "steps": 3,
            "tokens": 192,
            "seconds": 0.3,
            "step_time": 0.1,
            "step": 3,
            "position": 3,
            **fields,
        }
        return framing.tensor_frames(head, tensors, codec)

    def close(self):
        self.channel.close()


def rpc_error(fn):
    try:
        fn()
    except grpc.RpcError as exc:
        return exc
    raise AssertionError("expected the call to fail")


def params_of(service):
    return {n: t.clone() for n, t in service.core.params.items()}


def same(a, b):
    return set(a) == set(b) and all(torch.equal(a[n], b[n]) for n in a)
