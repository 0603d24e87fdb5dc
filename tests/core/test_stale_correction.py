"""HeLoCo's stale-work correction (`core.stale_correction`, `AlgorithmConfig.stale_correction`), off by
default: late work loses, per tensor, the fraction beta = min(-c |v| / (|v| + |m|), 1) of its component
along the outer momentum m when its cosine c with m is negative. Every number below is worked by hand."""

from __future__ import annotations

import math

import pytest
import torch

from ddiloco.core import AlgorithmConfig, SynchronizerCore, balanced_fragments
from ddiloco.core.stale_correction import correct_stale, shrink_factor

from .test_synchronizer import contribution, kinds


def test_a_tensor_exactly_opposing_the_momentum_is_scaled_by_one_minus_beta():
    # v = (-2, 0), m = (1, 0): c = -1, conf = 2 / (2 + 1) = 2/3, beta = 1 * 1 * 2/3 = 2/3;
    # v - beta c |v| m_hat = (-2, 0) - (2/3)(-1)(2)(1, 0) = (-2 + 4/3, 0) = (-2/3, 0) = (1 - 2/3) v
    values, norms = correct_stale({"w": torch.tensor([-2.0, 0.0])}, {"w": 2.0}, {"w": torch.tensor([1.0, 0.0])})
    assert torch.allclose(values["w"], torch.tensor([-2.0 / 3.0, 0.0]))
    assert norms["w"] == pytest.approx(2.0 / 3.0)


def test_only_the_component_along_the_momentum_is_shrunk():
    # v = (-3, 4), |v| = 5; m = (2, 0), |m| = 2: c = -6 / 10 = -0.6, conf = 5 / 7, beta = 0.6 * 5/7 = 3/7;
    # v - beta c |v| m_hat = (-3, 4) - (3/7)(-0.6)(5)(1, 0) = (-3 + 9/7, 4) = (-12/7, 4): the component
    # along m goes from -3 to -3 (1 - 3/7) = -12/7, the one across it (4) is kept
    v, m = torch.tensor([-3.0, 4.0]), torch.tensor([2.0, 0.0])
    values, norms = correct_stale({"w": v}, {"w": 5.0}, {"w": m})
    assert torch.allclose(values["w"], torch.tensor([-12.0 / 7.0, 4.0]))
    assert norms["w"] == pytest.approx(math.hypot(12.0 / 7.0, 4.0))
    # |v'|^2 = |v|^2 (1 - beta c^2 (2 - beta)) = 25 (1 - (3/7)(0.36)(11/7)) = 25 - 297/49
    assert norms["w"] ** 2 == pytest.approx(25.0 - 297.0 / 49.0, rel=1e-5)
    assert torch.equal(v, torch.tensor([-3.0, 4.0]))  # the given tensor is not changed in place
    assert shrink_factor(-0.6, 5.0, 2.0) == pytest.approx(3.0 / 7.0)


def test_agreeing_orthogonal_zero_and_momentum_less_tensors_are_kept_as_they_are():
    agree, across, zero, alone = (
        torch.tensor([1.0, 1.0]),
        torch.tensor([0.0, 3.0]),
        torch.zeros(2),
        torch.tensor([-1.0, 0.0]),
    )
    values = {"agree": agree, "across": across, "zero": zero, "alone": alone}
    norms = {"agree": math.sqrt(2.0), "across": 3.0, "zero": 0.0, "alone": 1.0}
    momentum = {name: torch.tensor([1.0, 0.0]) for name in ("agree", "across", "zero")}  # none for "alone"
    out, out_norms = correct_stale(values, norms, momentum)
    assert all(out[name] is values[name] for name in values)  # c >= 0, |v| = 0 or no momentum: untouched
    assert out_norms == norms
    assert shrink_factor(0.0, 1.0, 1.0) == 0.0 and shrink_factor(0.5, 1.0, 1.0) == 0.0


def test_a_bf16_contribution_is_corrected_in_float32():
    values, _ = correct_stale(
        {"w": torch.tensor([-3.0, 4.0], dtype=torch.bfloat16)}, {"w": 5.0}, {"w": torch.tensor([1.0, 0.0])}
    )
    # m = (1, 0): c = -0.6, conf = 5 / 6, beta = 0.5: (-3 + 0.5 * 0.6 * 5, 4) = (-1.5, 4)
    assert values["w"].dtype == torch.float32 and torch.allclose(values["w"], torch.tensor([-1.5, 4.0]))


def make(stale_correction: bool, momentum: float = 0.5) -> SynchronizerCore:
    """K = 1, no grace, lr 1, the mean merge: each round merges its opener (and any late work) at once."""
    config = AlgorithmConfig(
        fragments=1,
        sync_every=4,
        overlap=2,
        quorum=1,
        grace=0.0,
        outer_lr=1.0,
        outer_momentum=momentum,
        merge="mean",
        ema=1.0,
        max_outer_norm_ratio=0.0,
        stale_correction=stale_correction,
    )
    core = SynchronizerCore(config, balanced_fragments([("w", 2)], 1), {"w": torch.zeros(2)})
    for m in range(2):
        core.join(m, 0.0)
    return core


def late_scenario(core: SynchronizerCore) -> SynchronizerCore:
    # learner 0 makes version 1 alone: buf = (1, 0); w = -1 ((1, 0) + 0.5 (1, 0)) = (-1.5, 0)
    core.receive(contribution(0, [1.0, 0.0], version=0), now=0.0)
    assert core.versions[0] == 1
    # learner 1's work against version 0 arrives after that merge (1 version stale): held in a carry
    assert core.receive(contribution(1, [-3.0, 4.0], version=0), now=0.1) == []
    # learner 0's next work opens version 1's round with the carry; both weigh 100^2 / 4 = 2500
    out = core.receive(contribution(0, [1.0, 0.0], version=1), now=1.0)
    assert "Merged" in kinds(out) and core.versions[0] == 2
    return core


def test_the_core_corrects_late_work_against_the_fragment_s_momentum_by_hand():
    core = make(stale_correction=True)
    # the late (-3, 4) against buf (1, 0): c = -0.6, conf = 5 / (5 + 1) = 5/6, beta = 0.6 * 5/6 = 0.5,
    # v' = (-3 + 0.5 * 0.6 * 5, 4) = (-1.5, 4). Round: mean((1, 0), (-1.5, 4)) = (-0.25, 2);
    # buf = 0.5 (1, 0) + (-0.25, 2) = (0.25, 2); w = (-1.5, 0) - ((-0.25, 2) + 0.5 (0.25, 2)) = (-1.375, -3)
    late_scenario(core)
    assert torch.allclose(core.outer[0].buffers["w"], torch.tensor([0.25, 2.0]))
    assert torch.allclose(core.params["w"], torch.tensor([-1.375, -3.0]))


def test_off_by_default_late_work_is_merged_as_it_came_bit_for_bit():
    assert AlgorithmConfig().stale_correction is False
    core = make(stale_correction=False)
    core.receive(contribution(0, [1.0, 0.0], version=0), now=0.0)
    late = contribution(1, [-3.0, 4.0], version=0)
    core.receive(late, now=0.1)
    assert core.carries[0].work[0].norms == {"w": 5.0}  # its own norm: nothing was corrected
    core.receive(contribution(0, [1.0, 0.0], version=1), now=1.0)
    # mean((1, 0), (-3, 4)) = (-1, 2); buf = (0.5, 0) + (-1, 2) = (-0.5, 2);
    # w = (-1.5, 0) - ((-1, 2) + 0.5 (-0.5, 2)) = (-1.5 + 1.25, -3) = (-0.25, -3): exact in float32
    assert torch.equal(core.params["w"], torch.tensor([-0.25, -3.0]))


def test_the_corrected_norm_is_what_the_round_keeps():
    core = make(stale_correction=True)
    core.receive(contribution(0, [1.0, 0.0], version=0), now=0.0)
    core.receive(contribution(1, [-3.0, 4.0], version=0), now=0.1)
    # (-1.5, 4): |v'| = sqrt(2.25 + 16) (what RDA averages and the merge record reports)
    assert core.carries[0].work[0].norms["w"] == pytest.approx(math.sqrt(18.25))


def test_fresh_work_is_never_corrected_even_when_it_opposes_the_momentum():
    on, off = make(stale_correction=True), make(stale_correction=False)
    for core in (on, off):
        core.receive(contribution(0, [1.0, 0.0], version=0), now=0.0)  # buf (1, 0)
        core.receive(contribution(1, [-3.0, 4.0], version=1), now=1.0)  # on time, opposing: c = -0.6
        core.receive(contribution(0, [-2.0, 0.0], version=2), now=2.0)  # on time, exactly opposite
    assert on.versions[0] == off.versions[0] == 3
    assert torch.equal(on.params["w"], off.params["w"])
    assert torch.equal(on.outer[0].buffers["w"], off.outer[0].buffers["w"])


def test_without_outer_momentum_there_is_nothing_to_correct_against():
    on, off = late_scenario(make(True, momentum=0.0)), late_scenario(make(False, momentum=0.0))
    assert on.outer[0].buffers == {} and torch.equal(on.params["w"], off.params["w"])


def test_a_value_other_than_true_or_false_is_refused_naming_the_flag():
    with pytest.raises(ValueError, match="--stale-correction") as caught:
        AlgorithmConfig(stale_correction="yes")  # type: ignore[arg-type]
    assert "\n" not in str(caught.value)
