"""The public API around a running synchronizer: `ddiloco.Synchronizer` from a model object, a learner
told which fragments it just received, `ddiloco stop`, the checkpoint's version count, a budget of
merged tokens, `ddiloco export` and `load_global`/`fetch_global` (real gRPC on loopback)."""

from __future__ import annotations

import threading

import pytest
import torch
from safetensors.torch import load_file
from typer.testing import CliRunner

import ddiloco
from ddiloco.cli import _register, app
from ddiloco.learner.client import LearnerClient
from ddiloco.train.inner import InnerConfig, inner_step, make_inner_optimizer
from ddiloco.wire.timeouts import Timeouts

from ..support.runtime import wait_for

_register()
runner = CliRunner()
FAST = Timeouts.derive(0.1)


def train(task, address, learner, steps, applied, seed=1):
    model = task.build_model(seed)
    client = LearnerClient(model, address, learner, timeouts=FAST)
    opt = make_inner_optimizer(model, InnerConfig(batch_size=4))
    stream = task.stream(learner, 2, 4, 0)
    stream.seek(client.start())
    for _ in range(steps):
        if client.stopping:
            break
        batch = stream.next()
        inner_step(model, opt, task.loss(model, batch), 1.0)
        applied.extend((p, client.fragment_names(p)) for p in client.step(batch.tokens, position=stream.position))
    client.finish(timeout=5.0)


def test_synchronizer_from_a_model_object_stop_export(tiny_task, tmp_path):
    model = tiny_task.build_model(0)
    sync = ddiloco.Synchronizer(
        model,
        learners=2,
        sync_every=4,
        overlap=1,
        quorum=1,
        grace=0.5,
        checkpoint_dir=tmp_path / "ckpt",
        keep_versions=1,
        heartbeat=0.1,
    )
    assert sync.algorithm.fragments == 4  # default 24, capped at H = 4
    assert sync.plain_names == frozenset(tiny_task.embedding_names)  # found in the module, not listed by hand
    address = sync.start()
    applied: list = []
    thread = threading.Thread(target=train, args=(tiny_task, address, 0, 400, applied), daemon=True)
    thread.start()
    try:
        wait_for(lambda: sync.status()["merges"] >= 8, 60, message="eight merges")
        live = ddiloco.fetch_global(address)
        assert set(live) == set(dict(model.named_parameters()))
        result = runner.invoke(app, ["stop", address, "--reason", "test over"])
        assert result.exit_code == 0 and f"{address}: stopping" in result.output
        assert sync.wait(timeout=60)
        thread.join(60)
    finally:
        sync.stop()
    assert not thread.is_alive()
    fragments = {p for p, _ in applied}
    assert fragments and fragments <= set(range(4))
    assert all(names and set(names) <= set(live) for _, names in applied)
    on_disk = sorted((tmp_path / "ckpt" / "fragments").glob("*.safetensors"))
    assert len(on_disk) == 4  # keep_versions=1: one version per fragment
    out = tmp_path / "export"
    result = runner.invoke(app, ["export", str(tmp_path / "ckpt"), "--out", str(out)])
    assert result.exit_code == 0, result.output
    exported = load_file(str(out / "model.safetensors"))
    final = ddiloco.load_global(tmp_path / "ckpt")
    assert set(exported) == set(final) == set(live)  # parameters only: no outer-optimizer buffers
    assert all(torch.equal(exported[n], final[n]) for n in final)


def test_a_budget_of_merged_tokens_outlasts_one_of_trained_tokens(tiny_task, tmp_path):
    stopped_at = {}
    for counts in ("trained", "merged"):
        sync = ddiloco.Synchronizer(
            tiny_task.build_model(0),
            learners=2,
            sync_every=4,
            overlap=1,
            quorum=1,
            tokens=4 * 64 * 12,
            heartbeat=0.1,
            budget_counts=counts,
            arrival="overwrite",  # in-flight steps are lost: merged tokens trail trained ones
        )
        address = sync.start()
        thread = threading.Thread(target=train, args=(tiny_task, address, 0, 400, []), daemon=True)
        thread.start()
        try:
            assert sync.wait(timeout=60)
            thread.join(60)
            status = sync.status()
            stopped_at[counts] = (status["tokens_reported"], status["tokens_merged"])
        finally:
            sync.stop()
    assert stopped_at["merged"][1] >= 4 * 64 * 12 > stopped_at["trained"][1]


def test_unknown_settings_and_plain_names_are_refused(tiny_task):
    model = tiny_task.build_model(0)
    with pytest.raises(TypeError, match="unknown settings"):
        ddiloco.Synchronizer(model, sync_evry=4)
    with pytest.raises(ValueError, match="not a parameter"):
        ddiloco.Synchronizer(model, plain_names=["nope"])
