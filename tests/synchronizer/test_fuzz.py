"""Property-based fuzzing of a live synchronizer: whatever a client sends, the service keeps answering,
no handler raises (no UNKNOWN status), refused input leaves the global parameters unchanged, and
memory stays bounded. A fast run by default; `-m slow` runs the long campaign (thousands of cases)."""

from __future__ import annotations

import json
import resource

import grpc
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ddiloco.core import AlgorithmConfig
from ddiloco.wire import framing
from ddiloco.wire.protocol import signature
from ddiloco.wire.timeouts import Timeouts

from ..support.heads import params_digest
from ..support.runtime import RawClient, synchronizer

pytestmark = pytest.mark.timeout(1800)

FAST_CASES, SLOW_CASES = 40, 1500
CONTROL = ("Register", "Heartbeat", "Decline", "Leave", "Status", "Donor")
STREAMS = ("Push", "Donate")  # client streams: the payload is a list of frames
# K = 1, no grace, one learner: an accepted contribution merges at once, never later behind our back
ALGORITHM = AlgorithmConfig(fragments=2, sync_every=4, overlap=2, quorum=1, grace=0.0)

EDGE_VALUES = [
    0,
    -1,
    1,
    2**31,
    2**53,
    2**53 + 1,
    2**63,
    10**200,
    10**400,
    -(10**400),
    1e308,
    -1e-308,
    float("nan"),
    float("inf"),
    "",
    "x" * 10_000,
    True,
    None,
    [],
    {},
    {"a": [1]},
]
json_values = st.sampled_from(EDGE_VALUES) | st.recursive(
    st.none()
    | st.booleans()
    | st.integers(min_value=-(10**600), max_value=10**600)
    | st.floats(allow_nan=True, allow_infinity=True)
    | st.text(max_size=300),
    lambda children: st.lists(children, max_size=5) | st.dictionaries(st.text(max_size=10), children, max_size=5),
    max_leaves=20,
)
FIELDS = (
    "learner",
    "incarnation",
    "signature",
    "fresh",
    "session",
    "fragment",
    "version",
    "base_version",
    "steps",
    "tokens",
    "step",
    "position",
    "seconds",
    "step_time",
    "tokens_total",
    "span_start",
    "snapshot_wall",
    "state",
    "reason",
    "kind",
    "nbytes",
    "op",
    "ticket",
    "scalars",
    "checksum",
)


class Target:
    def __init__(self, service, address, sig, tensors):
        self.service, self.address, self.sig, self.tensors = service, address, sig, tensors
        self.client = RawClient(address)
        self.session = self.client.register(0, sig)["session"]

    def digest(self) -> str:
        return params_digest(self.service)

    def alive(self) -> None:
        """The service answers, and our own session is live (a fuzzed Register may have replaced it)."""
        status = self.client.call("Status", {}, timeout=10)
        assert "merges" in status
        if not self.client.call("Heartbeat", {"session": self.session}, timeout=10)["ok"]:
            self.session = self.client.register(0, self.sig)["session"]

    def send(self, method: str, payload) -> tuple[bool, object]:
        """(refused, answer); asserts that no handler raised."""
        try:
            if method in STREAMS:
                stub = self.client.stubs.push if method == "Push" else self.client.stubs.donate
                reply = framing.read_message(stub(iter(payload), timeout=10, metadata=self.client.stubs.metadata))
                return reply.get("ok") is not True, reply
            reply = framing.read_message(self.client.stubs.call(method, payload, 10))
            return reply.get("ok") is False, reply
        except grpc.RpcError as exc:
            assert exc.code() != grpc.StatusCode.UNKNOWN, f"{method} raised: {exc.details()}"
            return True, exc.code()


@pytest.fixture(scope="module")
def target(tmp_path_factory, tiny_task):
    tmp = tmp_path_factory.mktemp("fuzz")
    sig = signature(dict(tiny_task.build_model(0).named_parameters()))
    with synchronizer(
        tiny_task,
        tmp,
        algorithm=ALGORITHM,
        max_learners=4,
        max_message_bytes=2_000_000,
        tokens=10**12,
        timeouts=Timeouts.derive(0.5),
    ) as (service, address):
        reply = RawClient(address).call("Status", {})
        assert reply
        plan = service.plan_json
        tensors = {p: {n: torch.zeros(tuple(plan["shapes"][n])) for n in plan["names"][p]} for p in range(2)}
        yield Target(service, address, sig, tensors)


def check(target: Target, method: str, payload) -> None:
    before = target.digest()
    refused, answer = target.send(method, payload)
    if refused:
        assert target.digest() == before, f"refused {method} changed the global parameters: {answer}"
    target.alive()


def fuzz(cases: int):
    return settings(
        max_examples=cases,
        deadline=None,
        derandomize=True,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
    )


def campaign(test):
    """The same property twice: a fast default run and a long `slow` campaign."""
    fast = pytest.mark.parametrize(
        "size", [pytest.param(FAST_CASES, id="fast"), pytest.param(SLOW_CASES, id="campaign", marks=pytest.mark.slow)]
    )
    return fast(test)


@campaign
def test_random_bytes(target, size):
    @fuzz(size)
    @given(st.sampled_from(CONTROL + STREAMS), st.binary(max_size=2000))
    def run(method, data):
        check(target, method, [data] if method in STREAMS else data)

    run()


def base_heads(target: Target) -> dict[str, dict]:
    """A well-formed request of each control method, with every field it reads."""
    return {
        "Register": {"learner": 1, "incarnation": "fuzz", "signature": target.sig, "fresh": True},
        "Heartbeat": {
            "session": target.session,
            "step": 3,
            "tokens": 100,
            "position": 3,
            "step_time": 0.1,
            "state": "running",
        },
        "Decline": {"session": target.session, "fragment": 0, "version": 0, "reason": "no steps"},
        "Leave": {"session": "not-ours", "tokens": 5},
        "Stop": {"reason": "fuzz"},
        "Donor": {"session": target.session, "op": "poll", "ticket": "0123456789abcdef"},
    }


def test_every_field_of_every_method_against_every_edge_value(target):
    """A systematic sweep (no sampling): each field of each request set to each edge value in turn."""
    cases = 0
    for method, base in base_heads(target).items():
        if method == "Stop":
            continue  # a valid Stop ends the run for the rest of the module
        for field in base:
            for value in EDGE_VALUES:
                head = {**base_heads(target)[method], field: value}
                try:
                    payload = framing.message(head)
                except (ValueError, framing.WireError):
                    continue
                check(target, method, payload)
                cases += 1
    assert cases > 300


@campaign
def test_hostile_json_headers(target, size):
    """Headers that are valid frames but JSON no parser should trust: deep nesting, huge integers."""
    hostile = st.one_of(
        st.integers(1, 20_000).map(lambda n: b'{"head": ' + b"[" * n + b"]" * n + b"}"),
        st.integers(1, 20_000).map(lambda n: b'{"head": {"learner": 1' + b"0" * n + b"}}"),
        st.text(max_size=200).map(lambda t: json.dumps({"head": t}).encode()),
    )

    @fuzz(size)
    @given(st.sampled_from(CONTROL + STREAMS), hostile)
    def run(method, raw):
        frame = framing._PREFIX.pack(framing.MAGIC, framing.PROTOCOL_VERSION, len(raw)) + raw
        check(target, method, [frame] if method in STREAMS else frame)

    run()


@campaign
def test_random_heads_on_the_control_plane(target, size):
    @fuzz(size)
    @given(st.sampled_from(CONTROL), st.dictionaries(st.sampled_from(FIELDS), json_values, max_size=8), st.booleans())
    def run(method, head, with_session):
        if with_session:
            head = {**head, "session": target.session}
        try:
            payload = framing.message(head)
        except (ValueError, framing.WireError):
            return  # not encodable as a frame (NaN is fine, a huge header is refused when sending)
        check(target, method, payload)

    run()


@campaign
def test_mutated_contributions(target, size):
    @fuzz(size)
    @given(
        st.integers(0, 1),
        st.dictionaries(st.sampled_from(FIELDS), json_values, max_size=3),
        st.sampled_from(["fp32", "bf16", "int8", "int4"]),
        st.sampled_from([0.0, 1e-3, float("nan"), float("inf"), 3e38, -3e38, 1e30]),
        st.sampled_from(["ok", "drop_tensor", "wrong_shape", "truncate", "extra_frame", "bad_numbering"]),
    )
    def run(fragment, overrides, codec, value, damage):
        tensors = {n: torch.full_like(t, value) for n, t in target.tensors[fragment].items()}
        if damage == "drop_tensor":
            tensors.pop(next(iter(tensors)))
        if damage == "wrong_shape":
            name = next(iter(tensors))
            tensors[name] = torch.zeros(3, 1)
        head = {
            "kind": "contribution",
            "session": target.session,
            "fragment": fragment,
            "base_version": target.service.core.versions.get(fragment, 0),
            "steps": 3,
            "tokens": 192,
            "seconds": 0.3,
            "step_time": 0.1,
            "step": 3,
            "position": 3,
        }
        head.update(overrides)
        try:
            frames = framing.tensor_frames(head, tensors, codec, 4096)
        except (ValueError, TypeError, OverflowError, framing.WireError):
            return  # the codec cannot encode it (NaN in int8): a learner could not send it either
        if damage == "truncate":
            frames = frames[:-1] or [frames[0][:20]]
        elif damage == "extra_frame":
            frames = frames + frames[:1]
        elif damage == "bad_numbering":
            frame, body = framing.unpack_frame(frames[0])
            frames = [framing.pack_frame({**frame, "part": 7, "parts": 2}, body)] + frames[1:]
        check(target, "Push", frames)

    run()


@campaign
def test_memory_stays_bounded(target, size):
    """Oversized declarations and floods of refused calls do not grow the process without bound."""
    start = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    for i in range(size):
        head = {
            "msg": i,
            "part": 0,
            "parts": 3,
            "head": {"kind": "contribution", "nbytes": 1 << 30, "session": target.session},
        }
        check(target, "Push", [framing.pack_frame(head, b"x" * 64)])
    grown_mib = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - start) / 1024
    assert grown_mib < 256, f"RSS grew by {grown_mib:.0f} MiB"
    assert len(json.dumps(target.client.call("Status", {}))) < 100_000
