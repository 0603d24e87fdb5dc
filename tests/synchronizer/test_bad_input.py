"""Bad input gets a clear error, changes nothing, and never takes the service down."""

import struct

import grpc
import pytest
import torch

from ddiloco.records.events import read_events
from ddiloco.wire import framing
from ddiloco.wire.headers import Reply
from ddiloco.wire.protocol import signature

from ..support.runtime import RawClient, params_of, rpc_error, same, synchronizer

pytestmark = pytest.mark.timeout(60)
TOKEN = "s3cret"


@pytest.fixture()
def service(tiny_task, tmp_path):
    with synchronizer(tiny_task, tmp_path, token=TOKEN, max_learners=4, max_message_bytes=200_000) as (svc, address):
        client = RawClient(address, TOKEN)
        sig = signature(dict(tiny_task.build_model(0).named_parameters()))
        reply = client.register(0, sig)
        before = (params_of(svc), dict(svc.core.versions))
        yield svc, address, client, reply, sig
        client.close()
        assert same(before[0], params_of(svc)) and before[1] == svc.core.versions, "bad input changed the model"
        assert svc.status()["merges"] == 0


def fragment_tensors(svc, reply, p=0, value=0.01):
    shapes = reply["plan"]["shapes"]
    return {n: torch.full(tuple(shapes[n]), value) for n in reply["plan"]["names"][p]}


def test_wrong_or_missing_token_is_unauthenticated(service):
    svc, address, *_ = service
    for token in ("wrong", None):
        other = RawClient(address, token)
        err = rpc_error(lambda: other.call("Status", {}))
        other.close()
        assert err.code() == grpc.StatusCode.UNAUTHENTICATED and "auth token" in err.details()
    assert any(e["kind"] == "refused" for e in read_events(svc.events.path))


def test_unknown_learner_id_and_model_mismatch_are_refused_at_registration(service):
    svc, _, client, _, sig = service
    err = rpc_error(lambda: client.register(7, sig))
    assert err.code() == grpc.StatusCode.INVALID_ARGUMENT and "unknown learner id 7" in err.details()
    err = rpc_error(lambda: client.register(1, "0123456789abcdef"))
    assert err.code() == grpc.StatusCode.FAILED_PRECONDITION and "model mismatch" in err.details()


@pytest.mark.parametrize(
    "mutate, reason, code",
    [
        (lambda t: {n: v.reshape(-1)[:-1] for n, v in t.items()}, "shape", "bad_tensors"),
        (lambda t: {n + ".bogus": v for n, v in t.items()}, "wrong tensor names", "bad_tensors"),
        (lambda t: {n: v.fill_(float("nan")) for n, v in t.items()}, "NaN or Inf", "non_finite"),
        (lambda t: {n: v.fill_(float("inf")) for n, v in t.items()}, "NaN or Inf", "non_finite"),
    ],
)
def test_bad_tensors_are_rejected_counted_and_the_learner_reset(service, mutate, reason, code):
    svc, _, client, reply, _ = service
    frames = client.contribution(reply["session"], 0, mutate(fragment_tensors(svc, reply)), codec="bf16")
    answer = client.push_frames(frames)
    assert answer["ok"] is False and reason in answer["reason"] and answer["code"] == code
    assert Reply.decode(answer).action == "reset"
    assert svc.status()["rejected_contributions"] == 1
    logged = [e for e in read_events(svc.events.path) if e["kind"] == "rejected"]
    assert logged and reason in logged[-1]["reason"] and logged[-1]["code"] == code
    # the learner is sent the global value of the fragment to start over from
    session = svc.sessions[reply["session"]]
    frame = None
    while True:
        frame = session.outbox.get(0.5)
        assert frame is not None
        head, _ = framing.unpack_frame(frame)
        if head.get("head", {}).get("force"):
            break


def test_a_dtype_the_wire_does_not_know_is_refused(service):
    svc, _, client, reply, _ = service
    head = {
        "kind": "contribution",
        "session": reply["session"],
        "fragment": 0,
        "base_version": 0,
        "steps": 1,
        "tokens": 64,
        "seconds": 0.1,
        "step_time": 0.1,
        "step": 1,
        "position": 1,
    }
    name = reply["plan"]["names"][0][0]
    frames = framing.frames(dict(head, tensors=[[name, reply["plan"]["shapes"][name], "pickle"]]), [b"\x80\x04."])
    answer = client.push_frames(frames)
    assert answer["ok"] is False and "unknown codec 'pickle'" in answer["reason"] and answer["code"] == "bad_tensors"


def test_unknown_session_fragment_and_stale_version(service):
    svc, _, client, reply, _ = service
    tensors = fragment_tensors(svc, reply)
    answer = client.push_frames(client.contribution("no-such-session", 0, tensors))
    assert answer["ok"] is False and answer["code"] == "unknown_session" and "unknown session" in answer["reason"]
    assert Reply.decode(answer).action == "reregister"
    answer = client.push_frames(client.contribution(reply["session"], 9, tensors))
    assert answer["ok"] is False and "not owned" in answer["reason"] and answer["code"] == "not_owned"
    answer = client.push_frames(client.contribution(reply["session"], 0, tensors, base_version=5))
    assert answer["ok"] is False and "unknown version 5" in answer["reason"] and answer["code"] == "unknown_version"
    answer = client.push_frames(client.contribution(reply["session"], 0, tensors, steps="many"))
    assert answer["ok"] is False and "malformed" in answer["reason"] and answer["code"] == "malformed"
    answer = client.push_frames(client.contribution(reply["session"], 0, tensors, final="yes"))
    assert answer["ok"] is False and "malformed" in answer["reason"] and "'final'" in answer["reason"]


def test_oversized_contribution_is_refused_before_it_is_read(service):
    svc, _, client, reply, _ = service
    huge = {"x": torch.zeros(100_000)}
    err = rpc_error(lambda: client.push_frames(client.contribution(reply["session"], 0, huge)))
    assert err.code() == grpc.StatusCode.RESOURCE_EXHAUSTED and "exceeds the limit" in err.details()


def test_protocol_version_mismatch_and_garbage_frames(service):
    svc, _, client, reply, _ = service
    frame = framing.message({"kind": "status"})
    newer = frame[:3] + bytes([framing.PROTOCOL_VERSION + 1]) + frame[4:]
    err = rpc_error(lambda: client.stubs.call("Status", newer, 5))
    assert err.code() == grpc.StatusCode.INVALID_ARGUMENT and "protocol version mismatch" in err.details()
    err = rpc_error(lambda: client.stubs.call("Heartbeat", b"garbage-not-a-frame", 5))
    assert err.code() == grpc.StatusCode.INVALID_ARGUMENT and "bad magic" in err.details()
    err = rpc_error(lambda: client.push_frames([struct.pack("<3sBI", b"DDL", framing.PROTOCOL_VERSION, 2) + b"[]"]))
    assert err.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert client.call("Status", {})["merges"] == 0  # still serving


def test_a_step_time_past_an_hour_is_refused_where_it_enters(service):
    """#46: a reported step time up to 1e7 s was taken, and with it the grace and gathering windows
    (H steps' worth each) stretched for months. Past `MAX_STEP_SECONDS` (an hour) a contribution is
    refused as malformed, naming the field and its bound, and a heartbeat is INVALID_ARGUMENT; the
    core's step time is untouched."""
    svc, _, client, reply, _ = service
    before = svc.core.grace.step_time.value
    tensors = fragment_tensors(svc, reply)
    answer = client.push_frames(client.contribution(reply["session"], 0, tensors, step_time=1e7))
    assert answer["ok"] is False and "malformed" in answer["reason"] and "'step_time'" in answer["reason"]
    assert "3600" in answer["reason"]
    err = rpc_error(lambda: client.call("Heartbeat", {"session": reply["session"], "step_time": 3600.5}))
    assert err.code() == grpc.StatusCode.INVALID_ARGUMENT and "step_time" in err.details()
    assert client.call("Heartbeat", {"session": reply["session"], "step_time": 3600.0})["ok"] is True
    assert svc.core.grace.step_time.value == before


def test_a_leave_says_with_true_or_false_whether_the_learners_loop_is_over(service):
    """#47: `finished` (the learner leaves because its loop is over, not on an error) is checked where
    it enters; the last live learner's finished leave begins the final flush, as a budget would."""
    svc, _, client, reply, _ = service
    err = rpc_error(lambda: client.call("Leave", {"session": reply["session"], "finished": "yes"}))
    assert err.code() == grpc.StatusCode.INVALID_ARGUMENT and "'finished'" in err.details()
    assert svc.membership.session(reply["session"]) is not None and not svc.core.final_flush  # nothing changed
    assert client.call("Leave", {"session": reply["session"], "finished": True})["ok"] is True
    assert svc.core.final_flush and svc.core.learners_end.finished == {0} and not svc.stopping
    [event] = [e for e in read_events(svc.events.path) if e["kind"] == "final_flush"]
    assert event["began"] is True
