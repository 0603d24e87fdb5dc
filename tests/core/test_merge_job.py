"""Deferred merges (`defer_merges`): the round's tensor work as a job a driver computes off its lock."""

import itertools
import math

import pytest
import torch

from ddiloco.core import (
    AlgorithmConfig,
    Contribution,
    SynchronizerCore,
    balanced_fragments,
)
from ddiloco.core.merge import merge_direction
from ddiloco.core.merge_job import MergeDue, MergeResult
from ddiloco.core.outer import NesterovOuterOptimizer
from ddiloco.core.round_sum import RoundSum

_snapshots = itertools.count(1)  # a learner's step count only grows: each snapshot gets a new one


def contribution(learner, grad, tokens=100, version=0):
    return Contribution(learner, 0, version, {"w": torch.tensor(grad)}, 4, tokens, 4.0, 1.0, next(_snapshots))


def make(defer, momentum=0.5, merge="rda"):
    config = AlgorithmConfig(
        fragments=1,
        sync_every=4,
        overlap=2,
        quorum=2,
        grace=0.0,
        outer_lr=0.5,
        outer_momentum=momentum,
        merge=merge,
        ema=1.0,
        max_outer_norm_ratio=0.0,
    )
    core = SynchronizerCore(config, balanced_fragments([("w", 2)], 1), {"w": torch.zeros(2)}, defer_merges=defer)
    for m in range(2):
        core.join(m, 0.0)
    return core


def test_a_deferred_merge_is_a_job_whose_result_matches_the_direct_merge_by_hand():
    direct, deferred = make(False), make(True)
    for core in (direct, deferred):
        core.receive(contribution(0, [-3.0, 0.0]), now=0.0)
    out = deferred.receive(contribution(1, [0.0, -1.0], tokens=300), now=1.0)
    assert [type(a).__name__ for a in out] == ["MergeDue"] and deferred.versions[0] == 0
    job = out[0].job
    assert job.fragment == 0 and job.version == 0 and job.weights == (2500.0, 22500.0)
    # busy: a contribution against the version being merged is late for it; no new round opens, it
    # waits for the next round, one version late
    deferred.join(2, now=1.2)  # a learner whose work is not in the job (learner 0's would repeat it)
    late = deferred.receive(contribution(2, [1.0, 1.0]), now=1.5)
    assert late == [] and deferred.rounds == {}
    assert [(w.contribution.learner, w.staleness) for w in deferred.carries[0].work] == [(2, 1)]
    result = job.compute()
    finished = deferred.finish_merge(job, result, now=2.0)
    direct_out = direct.receive(contribution(1, [0.0, -1.0], tokens=300), now=1.0)
    assert (
        [type(a).__name__ for a in finished] == [type(a).__name__ for a in direct_out] == ["Merged", "FragmentUpdate"]
    )
    assert deferred.versions[0] == direct.versions[0] == 1 and deferred.merging == {}
    # RDA by hand: weights 0.1 / 0.9; mean norm 0.1*3 + 0.9*1 = 1.2; direction (-0.1, -0.9) / |.|
    direction = torch.tensor([-0.1, -0.9]) / math.hypot(0.1, 0.9)
    delta = 1.2 * direction  # first step: buf = delta; update = delta + 0.5 * delta
    expected = -0.5 * 1.5 * delta
    assert torch.allclose(deferred.params["w"], expected, atol=1e-6)
    assert torch.equal(deferred.params["w"], direct.params["w"])
    assert finished[0].merged_norm == pytest.approx(1.2) and finished[0].contribution_norm == pytest.approx(1.2)
    with pytest.raises(ValueError, match="no merge"):
        deferred.finish_merge(job, result, now=3.0)  # a job is finished once


def test_a_refused_deferred_step_keeps_the_version_and_resets_the_contributors():
    core = make(True)
    core.receive(contribution(0, [-1.0, 0.0]), now=0.0)
    [due] = core.receive(contribution(1, [0.0, -1.0]), now=0.1)
    assert isinstance(due, MergeDue)
    out = core.finish_merge(due.job, MergeResult({}, 0.0, "the merge failed: boom"), now=0.2)
    assert sorted(a.learner for a in out) == [0, 1] and all("non-finite" in a.reason or "boom" in a.reason for a in out)
    assert core.versions[0] == 0 and torch.equal(core.params["w"], torch.zeros(2)) and core.merging == {}
    core.receive(contribution(0, [-1.0, 0.0]), now=1.0)  # the fragment is free again
    assert isinstance(core.receive(contribution(1, [0.0, -1.0]), now=1.1)[0], MergeDue)


def test_merge_direction_folds_the_rda_scale_into_s():
    a, b = torch.tensor([3.0, 0.0]), torch.tensor([0.0, 4.0])
    direction, scale, update_norm = merge_direction([a, b], [1.0, 1.0])
    assert torch.allclose(direction * scale, torch.full((2,), 3.5 / math.sqrt(2)))  # 3.5 * unit((1, 1))
    assert update_norm == pytest.approx(3.5)  # mean of the norms 3 and 4
    direction, scale, update_norm = merge_direction([a, b], [1.0, 3.0], rda=False)
    assert torch.allclose(direction * scale, torch.tensor([0.75, 3.0]))
    assert update_norm == pytest.approx(math.hypot(0.75, 3.0))


def test_a_round_sum_keeps_no_contribution_and_falls_back_to_equal_weights_only_if_all_are_zero():
    first, second = torch.tensor([2.0, 0.0]), torch.tensor([0.0, 1.0])
    total = RoundSum({"w"})
    total.add({"w": first}, 0.0)  # no tokens: weight 0
    assert total.equal_weights
    total.add({"w": second}, 0.0)
    [(direction, scale, update_norm)] = total.result().values()
    # equal weights: mean norm 1.5, direction unit((1, 1))
    assert torch.allclose(direction * scale, torch.full((2,), 1.5 / math.sqrt(2))) and update_norm == pytest.approx(1.5)
    first.fill_(99.0)  # the sum holds its own tensor, not the contribution's
    assert torch.allclose(total.result()["w"][0] * total.result()["w"][1], torch.full((2,), 1.5 / math.sqrt(2)))
    total.add({"w": torch.tensor([0.0, -4.0])}, 2.0)  # a positive weight: the zero-weight ones count for nothing
    assert not total.equal_weights
    direction, scale, update_norm = total.result()["w"]
    assert torch.allclose(direction * scale, torch.tensor([0.0, -4.0])) and update_norm == pytest.approx(4.0)
    with pytest.raises(ValueError, match="finite"):
        total.add({"w": second}, -1.0)


def test_arrival_order_does_not_change_the_merge_beyond_rounding():
    values = [torch.randn(1000, generator=torch.Generator().manual_seed(i)) for i in range(4)]
    weights = [1.0, 2.0, 3.0, 4.0]
    forward = merge_direction(values, weights)
    backward = merge_direction(values[::-1], weights[::-1])
    assert torch.allclose(forward[0] * forward[1], backward[0] * backward[1], rtol=1e-5, atol=1e-7)


def test_bf16_contributions_summed_as_received_give_exactly_the_merge_of_their_float32_values():
    """The synchronizer keeps bf16 contributions in their wire bytes (no float32 copy in flight)."""
    values = [torch.randn(4097, generator=torch.Generator().manual_seed(i)).bfloat16() for i in range(3)]
    sums = {}
    for kind in ("bf16", "fp32"):
        total = RoundSum({"w"})
        for i, v in enumerate(values):
            v = v if kind == "bf16" else v.float()
            total.add({"w": v, "emb": v[:7]}, float(i + 1))  # "emb": a plain (mean) tensor, RDA's exception
        sums[kind] = total.result()
    for name in ("w", "emb"):
        (d16, s16, n16), (d32, s32, n32) = sums["bf16"][name], sums["fp32"][name]
        assert d16.dtype == torch.float32 and torch.equal(d16, d32) and s16 == s32 and n16 == n32


def test_a_round_reuses_the_sums_of_a_finished_one_and_merges_the_same():
    from ddiloco.core.round_sum import CHUNK, AccumulatorPool, norm

    pool = AccumulatorPool()
    first, second = (torch.randn(CHUNK + 5, generator=torch.Generator().manual_seed(i)) for i in (1, 2))
    done = RoundSum({"w"}, pool)
    done.add({"w": first}, 1.0)
    storage = done.result()["w"][0].data_ptr()
    done.release()
    again, fresh = RoundSum({"w"}, pool), RoundSum({"w"})
    for total in (again, fresh):
        total.add({"w": second.bfloat16()}, 2.0)  # bf16 longer than a chunk: converted chunk by chunk
    assert again.result()["w"][0].data_ptr() == storage  # no new fragment-sized allocation
    assert torch.equal(again.result()["w"][0], fresh.result()["w"][0])
    assert norm(second.bfloat16()) == pytest.approx(float(second.bfloat16().float().norm()), rel=1e-6)


def test_the_outer_check_bounds_cheaply_and_computes_exactly_only_near_overflow():
    opt = NesterovOuterOptimizer(lr=1.0, momentum=0.5)
    params = {"w": torch.tensor([1.0, -2.0])}
    opt.check(params, {"w": (torch.tensor([1.0, 1.0]), 2.0)})  # far from overflow: passes
    big = torch.tensor([3.0e38, 0.0])
    with pytest.raises(FloatingPointError):
        opt.check({"w": torch.tensor([-3.0e38, 0.0])}, {"w": (big, 1.0)})
    opt.check({"w": torch.tensor([3.0e38, 0.0])}, {"w": (big, 0.5)}, use_momentum=False)  # near, but finite
    with pytest.raises(FloatingPointError):
        opt.check(params, {"w": (torch.tensor([math.nan, 0.0]), 1.0)})
