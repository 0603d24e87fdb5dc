"""The eleven defects of the hardening campaign (issue 9), each reproduced against a real service.

Every test sends what the campaign sent and checks that the service still answers, that the global
parameters are unchanged by refused input, and that the refusal is counted.
"""

from __future__ import annotations

import json
import threading

import grpc
import pytest
import torch

from ddiloco.records.events import read_events
from ddiloco.synchronizer.checkpoint import CheckpointError, CheckpointStore
from ddiloco.synchronizer.streams import MAX_PUSHES_PER_SESSION
from ddiloco.wire import framing, reassembly
from ddiloco.wire.buffers import BufferPool
from ddiloco.wire.protocol import signature
from ddiloco.wire.timeouts import Timeouts

from ..support.runtime import (
    RawClient,
    params_of,
    rpc_error,
    same,
    synchronizer,
    wait_for,
)

pytestmark = pytest.mark.timeout(90)


@pytest.fixture()
def sig(tiny_task):
    return signature(dict(tiny_task.build_model(0).named_parameters()))


def tensors_for(reply, p=0, value=0.01):
    shapes = reply["plan"]["shapes"]
    return {n: torch.full(tuple(shapes[n]), value) for n in reply["plan"]["names"][p]}


def test_1_huge_finite_contribution_cannot_poison_the_model(tiny_task, tmp_path, sig):
    with synchronizer(tiny_task, tmp_path, max_learners=4) as (svc, address):
        client = RawClient(address)
        reply = client.register(0, sig)
        before = params_of(svc)
        answer = client.push_frames(client.contribution(reply["session"], 0, tensors_for(reply, value=3.0e38)))
        assert answer["ok"] is False and answer["reason"].startswith("outer gradient too large")
        assert same(before, params_of(svc)) and svc.core.versions[0] == 0
        assert all(torch.isfinite(t).all() for t in svc.core.params.values())
        client.close()


def test_1_checkpoints_and_init_files_with_nan_are_refused_on_load(tiny_task, tmp_path):
    with synchronizer(tiny_task, tmp_path) as (svc, _):
        pass  # writes the first checkpoint
    store = CheckpointStore(tmp_path / "ckpt")
    manifest = json.loads(store.manifest_path.read_text())
    path = store.frag_dir / manifest["fragments"]["0"]["file"]
    from safetensors.torch import load_file, save_file

    tensors = load_file(str(path))
    name = next(iter(tensors))
    tensors[name] = tensors[name].clone().fill_(float("nan"))
    save_file(tensors, str(path))
    with pytest.raises(CheckpointError, match="NaN or Inf"), synchronizer(tiny_task, tmp_path):
        pass


def test_2_absurd_token_count_in_a_heartbeat_is_refused_and_the_run_goes_on(tiny_task, tmp_path, sig):
    with synchronizer(tiny_task, tmp_path, tokens=10_000, max_learners=4) as (svc, address):
        client = RawClient(address)
        reply = client.register(0, sig)
        err = rpc_error(lambda: client.call("Heartbeat", {"session": reply["session"], "tokens": 10**400}))
        assert err.code() == grpc.StatusCode.INVALID_ARGUMENT and "'tokens'" in err.details()
        assert client.call("Heartbeat", {"session": reply["session"], "tokens": 5})["ok"] is True
        status = client.call("Status", {})
        assert status["stopping"] is False and status["tokens_reported"] == 5 and status["refused_calls"] >= 1
        assert client.register(1, sig)["session"]
        client.close()
    manifest = json.loads((tmp_path / "ckpt" / "manifest.json").read_text())
    assert max(manifest["ledger"]["books"]["0"]["tokens_reported"].values()) == 5


def test_2_a_manifest_with_an_absurd_count_is_a_clear_error(tiny_task, tmp_path):
    with synchronizer(tiny_task, tmp_path):
        pass
    path = tmp_path / "ckpt" / "manifest.json"
    manifest = json.loads(path.read_text())
    manifest["ledger"]["books"] = {"0": {"tokens_reported": {"x": 10**400}}}
    path.write_text(json.dumps(manifest))
    with pytest.raises(ValueError, match="ledger"), synchronizer(tiny_task, tmp_path):
        pass


def test_3_absurd_tokens_in_one_contribution_do_not_drop_the_round(tiny_task, tmp_path, sig):
    with synchronizer(tiny_task, tmp_path, max_learners=4) as (svc, address):
        a, b = RawClient(address), RawClient(address)
        ra, rb = a.register(0, sig), b.register(1, sig)
        bad = a.push_frames(a.contribution(ra["session"], 0, tensors_for(ra), tokens=10**200))
        assert bad["ok"] is False and "'tokens'" in bad["reason"]
        good = b.push_frames(b.contribution(rb["session"], 0, tensors_for(rb)))
        assert good["ok"] is True
        merges = wait_for(
            lambda: [e for e in read_events(tmp_path / "events.jsonl") if e["kind"] == "merge"],
            10,
            message="the honest learner's merge",
        )  # the event is written just after the version
        assert [m["learners"] for m in merges] == [[1]] and svc.core.versions[0] == 1
        a.close()
        b.close()


def test_4_stalled_pushes_give_their_slots_back(tiny_task, tmp_path, sig):
    # 6 bulk slots; 6 "learners" open a push, send one frame, and stop (slowloris)
    # failure timeout 3 s: the stalled pushes hold every slot long enough to be seen doing it, even on a busy machine
    with synchronizer(
        tiny_task, tmp_path, workers=10, reserved_control_workers=4, max_learners=8, timeouts=Timeouts.derive(0.5)
    ) as (svc, address):
        release = threading.Event()
        clients = [RawClient(address) for _ in range(7)]
        replies = [c.register(m, sig) for m, c in enumerate(clients)]
        outcomes = []

        def stall(client, reply):
            frames = client.contribution(reply["session"], 0, tensors_for(reply))
            frames = framing.frames(
                framing.unpack_frame(frames[0])[0]["head"],
                [b"".join(framing.unpack_frame(f)[1] for f in frames)],
                chunk_size=256,
            )

            def trickle():
                yield frames[0]
                release.wait(30)

            try:
                outcomes.append(client.push_frames(trickle(), timeout=40))
            except grpc.RpcError as exc:
                outcomes.append(exc.code())

        threads = [
            threading.Thread(target=stall, args=(c, r), daemon=True)
            for c, r in zip(clients[:6], replies[:6], strict=True)
        ]
        for t in threads:
            t.start()
        wait_for(lambda: svc.bulk_slots._value == 0, 10, message="the stalled pushes to take every slot")
        honest = wait_for(lambda: _try_push(clients[6], replies[6]), 60, 0.2, "an honest push to get through")
        assert honest["ok"] is True
        release.set()
        for t in threads:
            t.join(10)
        assert outcomes.count(grpc.StatusCode.DEADLINE_EXCEEDED) + outcomes.count(grpc.StatusCode.CANCELLED) >= 1
        assert any("idle" in r for r in svc.recent_rejections)
        for c in clients:
            c.close()


def _try_push(client, reply):
    client.call("Heartbeat", {"session": reply["session"]})  # the honest learner stays alive meanwhile
    try:
        return client.push_frames(client.contribution(reply["session"], 0, tensors_for(reply)), timeout=5)
    except grpc.RpcError as exc:
        if exc.code() == grpc.StatusCode.RESOURCE_EXHAUSTED:
            return None
        raise


def test_4_one_session_holds_at_most_max_pushes_and_one_subscribe(tiny_task, tmp_path, sig):
    # failure timeout 12 s: the held pushes must not be cut off as idle while the test looks at them
    with synchronizer(tiny_task, tmp_path, max_learners=4, timeouts=Timeouts.derive(2.0)) as (svc, address):
        client = RawClient(address)
        reply = client.register(0, sig)
        release = threading.Event()
        codes = []

        def held():
            frames = client.contribution(reply["session"], 0, tensors_for(reply))

            def gen():
                yield frames[0]
                release.wait(20)
                yield from frames[1:]

            try:
                client.push_frames(gen(), timeout=30)
                codes.append("ok")
            except grpc.RpcError as exc:
                codes.append(exc.code())

        threads = [threading.Thread(target=held, daemon=True) for _ in range(MAX_PUSHES_PER_SESSION + 1)]
        for t in threads:
            t.start()
        wait_for(lambda: grpc.StatusCode.RESOURCE_EXHAUSTED in codes, 10, message="the extra push refused")
        release.set()
        for t in threads:
            t.join(20)
        assert codes.count(grpc.StatusCode.RESOURCE_EXHAUSTED) == 1
        # a second Subscribe of the same session replaces the first
        first = client.stubs.subscribe(
            framing.message({"session": reply["session"]}), timeout=30, metadata=client.stubs.metadata
        )
        wait_for(lambda: svc.bulk_slots._value < svc.settings.workers - 8, 5, message="the first subscribe")
        second = client.stubs.subscribe(
            framing.message({"session": reply["session"]}), timeout=30, metadata=client.stubs.metadata
        )
        with pytest.raises(grpc.RpcError):
            for _ in first:
                pass
        # however many Subscribes one session opens (never reading them), it holds one bulk slot
        more = [
            client.stubs.subscribe(
                framing.message({"session": reply["session"]}), timeout=30, metadata=client.stubs.metadata
            )
            for _ in range(5)
        ]
        free = svc.settings.workers - svc.settings.reserved_control_workers
        wait_for(lambda: svc.bulk_slots._value == free - 1, 10, message="one Subscribe slot for the session")
        for call in [second, *more]:
            call.cancel()
        client.close()


def _rss_bytes() -> int:
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) * 1024 for line in f if line.startswith("VmRSS:"))


def test_5_memory_is_taken_only_as_payload_arrives():
    """A first frame that declares 2 GiB reserves address space for the message, not memory: the
    process's resident memory does not grow by the gigabytes (with or without a buffer pool)."""
    for pool in (None, BufferPool(4 << 30)):
        r = reassembly.Reassembler(limit=1 << 32, pool=pool)
        before = _rss_bytes()
        head = {"msg": 1, "part": 0, "parts": 4, "head": {"kind": "contribution", "nbytes": 2 << 30}}
        assert r.feed(framing.pack_frame(head, b"x" * 100)) is None
        assert _rss_bytes() - before < 256 << 20  # not gigabytes
        [(state)] = r._open.values()
        assert state[2] == 100 and bytes(state[1][:100]) == b"x" * 100


def test_6_a_fragment_file_left_by_a_killed_writer_is_not_reused(tiny_task, tmp_path):
    with synchronizer(tiny_task, tmp_path):
        pass
    store = CheckpointStore(tmp_path / "ckpt")
    orphan = store.frag_dir / store.fragment_file(0, 1)
    orphan.write_bytes(b"left by a process killed before its manifest rename")
    assert CheckpointStore(tmp_path / "ckpt")._on_disk == {store.fragment_file(p, 0) for p in range(2)}
    assert not orphan.exists()


def test_7_learner_state_is_bounded(tiny_task, tmp_path, sig):
    with synchronizer(tiny_task, tmp_path, max_learners=4) as (svc, address):
        client = RawClient(address)
        err = rpc_error(lambda: client.register(4, sig))
        assert err.code() == grpc.StatusCode.INVALID_ARGUMENT and "--max-learners" in err.details()
        err = rpc_error(lambda: client.register(0, sig, incarnation="x" * 4000))
        assert err.code() == grpc.StatusCode.INVALID_ARGUMENT
        reply = client.register(0, sig)
        err = rpc_error(lambda: client.call("Heartbeat", {"session": reply["session"], "state": "s" * 600_000}))
        assert err.code() == grpc.StatusCode.INVALID_ARGUMENT and "'state'" in err.details()
        client.register(0, sig, incarnation="thief")  # a takeover is allowed (trust model) but never silent
        replaced = [e for e in read_events(tmp_path / "events.jsonl") if e["kind"] == "replaced"]
        assert replaced[-1]["incarnation"] == "thief" and replaced[-1]["previous"] == "raw"
        for i in range(40):  # a learner restarted 40 times keeps a bounded book
            client.register(0, sig, incarnation=f"i{i}")
            svc.ledger.report_tokens(0, f"i{i}", 10)
        book = svc.ledger.book(0)
        assert len(book.tokens_reported) <= 17 and book.tokens_trained == 400
        assert len(json.dumps(client.call("Status", {}))) < 20_000
        client.close()


@pytest.mark.parametrize(
    "head, field",
    [
        ({"learner": 0, "incarnation": "a", "signature": "s", "deep": json.loads("[" * 900 + "]" * 900)}, None),
        ({"learner": 0, "incarnation": "a", "signature": 5}, "signature"),
        ({"learner": True, "incarnation": "a", "signature": "s"}, "learner"),
        ({"learner": 0, "incarnation": ["a"], "signature": "s"}, "incarnation"),
        ({"learner": 0, "incarnation": "a", "signature": "s", "holds": ["0" * 32]}, "holds"),
        ({"learner": 0, "incarnation": "a", "signature": "s", "holds": {"no.such.tensor": "0" * 32}}, "holds"),
        ({"learner": 0, "incarnation": "a", "signature": "s", "holds": {"x": 7}}, "holds"),
    ],
)
def test_8_register_never_raises_on_malformed_input(tiny_task, tmp_path, head, field):
    with synchronizer(tiny_task, tmp_path) as (svc, address):
        client = RawClient(address)
        err = rpc_error(lambda: client.call("Register", head))
        assert err.code() in (grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.FAILED_PRECONDITION)
        if field:
            assert field in err.details()
        client.close()


def test_8_deep_json_and_huge_integers_are_refused_at_the_wire(tiny_task, tmp_path):
    with synchronizer(tiny_task, tmp_path) as (svc, address):
        client = RawClient(address)
        for raw_head in (
            b'{"head": ' + b"[" * 100_000 + b"]" * 100_000 + b"}",
            b'{"head": {"learner": 1' + b"0" * 5000 + b"}}",
        ):
            frame = framing._PREFIX.pack(framing.MAGIC, framing.PROTOCOL_VERSION, len(raw_head)) + raw_head
            err = rpc_error(lambda: client.stubs.call("Register", frame, 5))
            assert err.code() == grpc.StatusCode.INVALID_ARGUMENT and "JSON" in err.details()
        assert client.call("Status", {})["refused_calls"] >= 2
        client.close()


@pytest.mark.parametrize(
    "fields",
    [
        {"span_start": "soon"},
        {"snapshot_wall": [1]},
        {"span_start": 1e300},
        {"seconds": -1.0},
        {"step_time": float("inf")},
        {"position": -3},
        {"base_version": 2**60},
        {"tokens_total": "many"},
    ],
)
def test_8_contribution_fields_out_of_range_are_rejected_and_counted(tiny_task, tmp_path, sig, fields):
    with synchronizer(tiny_task, tmp_path, max_learners=4) as (svc, address):
        client = RawClient(address)
        reply = client.register(0, sig)
        before = params_of(svc)
        answer = client.push_frames(client.contribution(reply["session"], 0, tensors_for(reply), **fields))
        assert answer["ok"] is False and "malformed contribution header" in answer["reason"]
        assert svc.status()["rejected_contributions"] == 1 and same(before, params_of(svc))
        client.close()


def test_11_refused_calls_cannot_fill_the_disk(tiny_task, tmp_path):
    with synchronizer(tiny_task, tmp_path, token="s3cret") as (svc, address):
        channel = grpc.insecure_channel(address)
        calls = 0
        for _ in range(200):
            method = channel.unary_unary("/" + "x" * 8000)
            try:
                method(b"", timeout=5, metadata=(("x-ddiloco-token", "wrong"),))
            except grpc.RpcError:
                calls += 1
        channel.close()
        assert calls == 200 and svc.refused_rpcs == 200
        size = (tmp_path / "events.jsonl").stat().st_size
        assert size < 50_000, f"{size} bytes of event log for 200 refused calls"
        refused = [e for e in read_events(tmp_path / "events.jsonl") if e["kind"] == "refused"]
        assert refused and all(len(e["method"]) <= 64 for e in refused)
