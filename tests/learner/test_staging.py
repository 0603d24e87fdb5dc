"""Snapshots through reused host buffers: taken at the boundary, subtracted later, never shared while in use."""

import pytest
import torch

from ddiloco.core import (
    FragmentUpdate,
    LearnerCore,
    Schedule,
    balanced_fragments,
)
from ddiloco.learner.staging import SnapshotStager, StagedGradient, pin, release

from ..support.runtime import mlp_run, train_until_accepted


def test_the_snapshot_holds_the_values_of_the_boundary_not_of_the_later_access():
    params = {"w": torch.arange(6, dtype=torch.float32).reshape(2, 3)}
    base = {"w": torch.full((2, 3), 10.0)}
    staged = SnapshotStager(params).stage(0, base)
    at_boundary = params["w"].clone()
    params["w"].add_(100.0)  # the optimizer moves on before the sending thread reads the snapshot
    base["w"] = torch.zeros(2, 3)  # an arrival replaces the base entry: the snapshot keeps its own reference
    assert torch.equal(staged["w"], torch.full((2, 3), 10.0) - at_boundary)
    assert torch.equal(staged["w"], staged["w"])  # subtracted once, whatever the number of reads


def test_buffers_are_reused_once_released_and_never_shared_while_in_use():
    params = {"w": torch.ones(4)}
    stager = SnapshotStager(params)
    first = stager.stage(0, {"w": torch.zeros(4)})
    ptr = first["w"].data_ptr()
    second = stager.stage(0, {"w": torch.zeros(4)})  # a retry while the first is still queued
    assert second["w"].data_ptr() != ptr and torch.equal(first["w"], -torch.ones(4))
    release(first)
    release(first)  # idempotent: the buffer goes back once
    params["w"].fill_(3.0)
    third = stager.stage(0, {"w": torch.zeros(4)})
    assert third["w"].data_ptr() == ptr and torch.equal(third["w"], torch.full((4,), -3.0))
    fourth = stager.stage(0, {"w": torch.zeros(4)})  # the second one is still held: a new buffer
    assert fourth["w"].data_ptr() not in (ptr, second["w"].data_ptr())
    assert stager.allocated == 3
    with pytest.raises(RuntimeError, match="released"):
        first["w"]
    release({"w": torch.zeros(1)})  # a plain dict (the simulator's contributions): nothing to do


def run_core(stage: bool) -> list:
    params = {"a": torch.zeros(5), "b": torch.zeros(3)}
    plan = balanced_fragments([("a", 5), ("b", 3)], 2)
    core = LearnerCore(0, params, plan, Schedule(2, 4, 1), stage=SnapshotStager(params).stage if stage else None)
    core.join(
        [
            FragmentUpdate(0, 0, {"a": torch.linspace(0, 1, 5)}, (0,)),
            FragmentUpdate(1, 0, {"b": torch.full((3,), 2.0)}, (0,)),
        ]
    )
    sent = []
    torch.manual_seed(0)
    for step in range(12):
        for t in params.values():
            t.add_(torch.randn_like(t))
        for m in core.after_step(10, 0.1):
            sent.append((step, m.fragment, {n: g.clone() for n, g in m.outer_gradient.items()}))
            release(m.outer_gradient)
            core.receive(
                FragmentUpdate(
                    m.fragment,
                    core.versions[m.fragment] + 1,
                    {n: torch.full_like(params[n], float(step)) for n in m.outer_gradient},
                    (0,),
                )
            )
    return sent


def test_the_core_sends_the_same_gradients_with_and_without_staging():
    eager, staged = run_core(False), run_core(True)
    assert len(eager) >= 4 and [s[:2] for s in eager] == [s[:2] for s in staged]
    for (_, _, a), (_, _, b) in zip(eager, staged, strict=True):
        assert a.keys() == b.keys() and all(torch.equal(a[n], b[n]) for n in a)


def test_an_owned_update_becomes_the_base_copy_without_a_copy_and_a_shared_one_is_copied():
    params = {"a": torch.zeros(4)}
    core = LearnerCore(0, params, balanced_fragments([("a", 4)], 1), Schedule(1, 4, 1))
    owned, shared = torch.full((4,), 1.0), torch.full((4,), 2.0)
    core.join([FragmentUpdate(0, 0, {"a": owned}, (0,), owned=True)])
    assert core.base[0]["a"].data_ptr() == owned.data_ptr() and torch.equal(params["a"], owned)
    core.receive(FragmentUpdate(0, 1, {"a": shared}, (0,)))  # the simulator hands every learner the same tensors
    core.after_step(1, 0.1)
    shared.fill_(-1.0)
    assert torch.equal(core.base[0]["a"], torch.full((4,), 2.0)) and torch.equal(params["a"], torch.full((4,), 2.0))


def test_a_client_reuses_one_buffer_set_per_fragment_over_a_real_run():
    with mlp_run() as (_, client, model):
        stager = client.core.stage.__self__
        assert isinstance(stager, SnapshotStager) and not stager.pinned  # no CUDA here: plain host buffers
        accepted = train_until_accepted(client, model, 12)
        assert accepted >= 12
    # Buffers are reused: without reuse every snapshot takes a set (12 or more here). A snapshot whose
    # fragment's previous push is still being encoded (under load, a gRPC push's frames are made as
    # gRPC sends them) takes a fresh one, so the bound is "most reuse", not one set per fragment.
    assert stager.allocated <= accepted // 2, f"{stager.allocated} buffer sets for {accepted} contributions"


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_snapshots_copy_on_a_side_stream_into_pinned_memory_and_arrivals_are_pinned():
    params = {"w": torch.randn(1 << 20, device="cuda")}
    stager = SnapshotStager(params)
    at_boundary = params["w"].cpu()
    staged = stager.stage(0, {"w": torch.zeros(1 << 20)})
    params["w"].mul_(-3.0)  # queued on the compute stream after the device copy: must not reach the snapshot
    assert isinstance(staged, StagedGradient) and staged["w"].is_pinned()
    assert torch.equal(staged["w"], -at_boundary)
    arrived = pin({"w": torch.ones(3)}, True)
    assert arrived["w"].is_pinned()
