import json

import pytest
import torch

from ddiloco.core import AlgorithmConfig, Contribution, SynchronizerCore, plan_for_model
from ddiloco.synchronizer.checkpoint import CheckpointStore, load_global_params


def core_with_merges(merges=3):
    params = {"w": torch.arange(6.0).reshape(2, 3), "b": torch.ones(3), "c": torch.zeros(2)}
    config = AlgorithmConfig(fragments=2, sync_every=2, overlap=1)
    core = SynchronizerCore(config, plan_for_model(params, 2), params)
    core.join(0, 0.0)
    for i in range(merges):
        for p in range(2):
            grads = {n: torch.full_like(core.params[n], 0.1 * (i + 1)) for n in core.plan.names[p]}
            core.receive(Contribution(0, p, core.versions[p], grads, 2, 20, 0.2, 0.1, 2 * (i + 1)), float(i))
    return core, params


def test_round_trip_restores_parameters_versions_and_outer_momentum(tmp_path):
    core, params = core_with_merges()
    store = CheckpointStore(tmp_path)
    store.save(core, {"signature": "x"}, {"merges": 6})
    fresh = SynchronizerCore(core.config, core.plan, params)
    manifest = CheckpointStore(tmp_path).load(fresh, {"signature": "x"})
    assert fresh.versions == core.versions == {0: 3, 1: 3}
    assert all(torch.equal(fresh.params[n], core.params[n]) for n in core.params)
    for p in (0, 1):
        assert all(torch.equal(fresh.outer[p].buffers[n], core.outer[p].buffers[n]) for n in core.outer[p].buffers)
    assert manifest["ledger"] == {"merges": 6}
    params_back, versions = load_global_params([tmp_path])
    assert versions == {0: 3, 1: 3} and torch.equal(params_back["w"], core.params["w"])


def test_a_checkpoint_of_another_run_is_refused(tmp_path):
    core, params = core_with_merges(1)
    CheckpointStore(tmp_path).save(core, {"signature": "aaa"}, {})
    with pytest.raises(ValueError, match="different run"):
        CheckpointStore(tmp_path).load(SynchronizerCore(core.config, core.plan, params), {"signature": "bbb"})


def test_only_changed_fragments_are_written_and_old_versions_are_collected(tmp_path):
    core, _ = core_with_merges(1)
    store = CheckpointStore(tmp_path, keep_versions=2)
    store.save(core, {}, {})
    snap = store.snapshot(core, {}, {})
    assert snap.tensors == {}  # nothing changed since the last checkpoint
    for i in range(3):
        grads = {n: torch.full_like(core.params[n], 0.1) for n in core.plan.names[0]}
        core.receive(Contribution(0, 0, core.versions[0], grads, 2, 20, 0.2, 0.1, 9 + 2 * i), 9.0 + i)
        snap = store.snapshot(core, {}, {})
        assert set(snap.tensors) == {0}
        store.write(snap)
    files = sorted(p.name for p in (tmp_path / "fragments").iterdir())
    assert files == ["p0000-v00000003.safetensors", "p0000-v00000004.safetensors", "p0001-v00000001.safetensors"]


def test_a_torn_write_leaves_the_last_committed_checkpoint_readable(tmp_path):
    core, params = core_with_merges(2)
    store = CheckpointStore(tmp_path)
    store.save(core, {}, {})
    committed = json.loads((tmp_path / "manifest.json").read_text())
    # a process killed mid-write leaves temporary files behind; they are never read
    (tmp_path / ".manifest.json.tmp-99999").write_text("{ torn")
    (tmp_path / "fragments" / ".p0000-v00000009.safetensors.tmp-99999").write_bytes(b"\0" * 10)
    fresh = SynchronizerCore(core.config, core.plan, params)
    assert CheckpointStore(tmp_path).load(fresh)["seq"] == committed["seq"]
    assert fresh.versions == core.versions


def test_the_outer_step_count_survives_a_restart_and_the_next_step_is_the_uninterrupted_one(tmp_path):
    """Bias correction and restarting read the fragment's outer step count: the manifest keeps it,
    so a restored core takes the step the running one takes."""
    params = {"w": torch.arange(6.0).reshape(2, 3), "b": torch.ones(3), "c": torch.zeros(2)}
    config = AlgorithmConfig(fragments=2, sync_every=2, overlap=1, grace=0.0, outer_debias=True, outer_restart_every=3)

    def merge(core, p, i, learner=1):
        grads = {n: torch.full_like(core.params[n], 0.1 * (i + 1)) for n in core.plan.names[p]}
        core.receive(Contribution(learner, p, core.versions[p], grads, 2, 20, 0.2, 0.1, 100 + i), float(i))

    core = SynchronizerCore(config, plan_for_model(params, 2), params)
    core.join(0, 0.0)
    core.join(1, 0.0)
    merge(core, 0, 0)
    merge(core, 0, 1)
    core.finishing(0, 2.0)  # learner 0 ends its loop: its last work is a plain step, not counted
    merge(core, 0, 2, learner=0)
    merge(core, 0, 3)
    merge(core, 0, 4)
    assert core.versions[0] == 5 and core.outer[0].steps == 4 and core.outer[1].steps == 0
    CheckpointStore(tmp_path).save(core, {}, {})
    manifest = json.loads((tmp_path / "manifest.json").read_text())
    assert [manifest["fragments"][p]["outer_steps"] for p in ("0", "1")] == [4, 0]
    fresh = SynchronizerCore(config, core.plan, params)
    CheckpointStore(tmp_path).load(fresh)
    assert fresh.outer[0].steps == 4
    fresh.join(1, 0.0)
    merge(core, 0, 5)
    merge(fresh, 0, 5)  # t = 5: age 3 since the restart at t = 3 (counted from the version: t = 6, a restart)
    assert all(torch.equal(fresh.params[n], core.params[n]) for n in core.plan.names[0])


@pytest.mark.parametrize("steps", [-1, 5, True, 1.5, "4"])
def test_an_outer_step_count_out_of_range_is_refused_on_load(tmp_path, steps):
    core, params = core_with_merges(4)
    CheckpointStore(tmp_path).save(core, {}, {})
    path = tmp_path / "manifest.json"
    manifest = json.loads(path.read_text())
    manifest["fragments"]["0"]["outer_steps"] = steps  # fragment 0 is at version 4
    path.write_text(json.dumps(manifest))
    with pytest.raises(ValueError, match="bad entry for fragment '0'"):
        CheckpointStore(tmp_path).load(SynchronizerCore(core.config, core.plan, params))


def test_a_manifest_without_outer_step_counts_loads_with_the_versions_as_counts(tmp_path):
    core, params = core_with_merges(3)
    CheckpointStore(tmp_path).save(core, {}, {})
    path = tmp_path / "manifest.json"
    manifest = json.loads(path.read_text())
    for entry in manifest["fragments"].values():
        del entry["outer_steps"]
    path.write_text(json.dumps(manifest))
    fresh = SynchronizerCore(core.config, core.plan, params)
    CheckpointStore(tmp_path).load(fresh)
    assert {p: fresh.outer[p].steps for p in (0, 1)} == {0: 3, 1: 3}
