"""The outer step's options (issue #47, item 1, the outer side), each off by default: outer-momentum
bias correction, outer-momentum restarting and an outer lr that grows with the contributions merged.
Every value below is worked by hand: lr 1, momentum 0.5 and a constant outer gradient 1 unless said."""

from __future__ import annotations

import math

import pytest
import torch

from ddiloco.core import AlgorithmConfig, SynchronizerCore, balanced_fragments
from ddiloco.core.outer import NesterovOuterOptimizer
from ddiloco.core.sync_state import SyncState

from .test_synchronizer import contribution, kinds


def run(opt: NesterovOuterOptimizer, deltas: list[float], contributions: int = 1) -> list[tuple[float, float]]:
    """(the parameter, the buffer) after each step of `deltas`, from 0."""
    params = {"w": torch.zeros(1)}
    out = []
    for d in deltas:
        opt.step(params, {"w": torch.tensor([d])}, contributions=contributions)
        out.append((float(params["w"]), float(opt.buffers["w"]) if "w" in opt.buffers else math.nan))
    return out


def old_apply(p: torch.Tensor, buf: torch.Tensor | None, d: torch.Tensor, lr: float, mu: float, momentum: bool):
    """The outer step before the options, as it was written (the reference for 'bit for bit')."""
    if mu > 0 and momentum:
        buf = d.clone() if buf is None else buf.mul_(mu).add_(d)
        p.add_(d, alpha=-lr).add_(buf, alpha=-lr * mu)
    else:
        p.add_(d, alpha=-lr)
    return buf


def test_with_the_options_off_the_step_is_today_s_bit_for_bit():
    gen = torch.Generator().manual_seed(0)
    opt = NesterovOuterOptimizer(lr=0.7, momentum=0.5)
    params, ref, buf = {"w": torch.randn(64, generator=gen)}, None, None
    ref = params["w"].clone()
    for i, momentum in enumerate([True, True, False, True, True, True]):
        d = torch.randn(64, generator=gen)
        opt.step(params, {"w": d}, use_momentum=momentum, contributions=1 + i)  # M has no effect with k = 0
        buf = old_apply(ref, buf, d, 0.7, 0.5, momentum)
        assert torch.equal(params["w"], ref) and torch.equal(opt.buffers["w"], buf), i
    assert opt.steps == 5  # the steps that took momentum
    defaults = AlgorithmConfig()
    assert (defaults.outer_debias, defaults.outer_restart_every, defaults.outer_lr_per_learner) == (
        False,
        0,
        0.0,
    )


def test_bias_correction_makes_a_constant_outer_gradient_step_as_far_at_once_as_at_steady_state():
    # off: buf 1, 1.5, 1.75; steps 1 + 0.5 buf = 1.5, 1.75, 1.875 -> w = -1.5, -3.25, -5.125
    plain = run(NesterovOuterOptimizer(lr=1.0, momentum=0.5), [1.0, 1.0, 1.0])
    assert plain == [(-1.5, 1.0), (-3.25, 1.5), (-5.125, 1.75)]
    # on: the buffer's term times 1 / (1 - 0.5^t) = 2, 4/3, 8/7: 0.5 * 2 * 1 = 0.5 * 4/3 * 1.5 =
    # 0.5 * 8/7 * 1.75 = 1, so every step is 1 + 1 = 2 = lr d / (1 - mu), the steady state's step
    corrected = run(NesterovOuterOptimizer(lr=1.0, momentum=0.5, bias_correction=True), [1.0, 1.0, 1.0])
    assert [w for w, _ in corrected] == pytest.approx([-2.0, -4.0, -6.0], abs=1e-6)
    assert [b for _, b in corrected] == [1.0, 1.5, 1.75]  # the buffer itself is kept uncorrected
    # a varying outer gradient 1 then 2: buf 1 then 2.5; w = -(1 + 0.5 * 2 * 1) - (2 + 0.5 * 4/3 * 2.5)
    varying = run(NesterovOuterOptimizer(lr=1.0, momentum=0.5, bias_correction=True), [1.0, 2.0])
    assert varying[-1][0] == pytest.approx(-2.0 - (2.0 + 5.0 / 3.0), abs=1e-6)


def test_momentum_restart_zeroes_the_buffer_before_every_r_th_step():
    # R = 2: the buffer is zeroed before steps 2 and 4: buf 1, 1, 1.5, 1; steps 1 + 0.5 buf
    restarted = run(NesterovOuterOptimizer(lr=1.0, momentum=0.5, restart=2), [1.0, 1.0, 1.0, 1.0])
    assert [b for _, b in restarted] == [1.0, 1.0, 1.5, 1.0]
    assert [w for w, _ in restarted] == [-1.5, -3.0, -4.75, -6.25]
    # R = 0 (the default) never restarts: buf 1, 1.5, 1.75, 1.875
    assert [b for _, b in run(NesterovOuterOptimizer(lr=1.0, momentum=0.5), [1.0] * 4)] == [1.0, 1.5, 1.75, 1.875]
    # with bias correction the buffer's age counts from the restart: ages 1, 1, 2, 1, so every step is 2
    both = run(NesterovOuterOptimizer(lr=1.0, momentum=0.5, bias_correction=True, restart=2), [1.0] * 4)
    assert [w for w, _ in both] == pytest.approx([-2.0, -4.0, -6.0, -8.0], abs=1e-6)


def test_the_outer_lr_grows_with_the_contributions_merged():
    # k = 0.5, no momentum: lr(M) = 1 * (1 + 0.5 (M - 1)): 1 for M = 1, 2 for M = 3
    assert run(NesterovOuterOptimizer(lr=1.0, momentum=0.0, lr_per_learner=0.5), [1.0], contributions=1)[0][0] == -1.0
    assert run(NesterovOuterOptimizer(lr=1.0, momentum=0.0, lr_per_learner=0.5), [1.0], contributions=3)[0][0] == -2.0
    # k = 0 (the default): 1 whatever M
    assert run(NesterovOuterOptimizer(lr=1.0, momentum=0.0), [1.0], contributions=3)[0][0] == -1.0


def test_the_core_scales_the_outer_lr_by_the_round_s_contributions_by_hand():
    config = AlgorithmConfig(
        fragments=1,
        sync_every=4,
        overlap=2,
        quorum=3,
        grace=0.0,
        outer_lr=0.5,
        outer_momentum=0.0,
        merge="mean",
        max_outer_norm_ratio=0.0,
        outer_lr_per_learner=0.5,
    )
    core = SynchronizerCore(config, balanced_fragments([("w", 2)], 1), {"w": torch.zeros(2)})
    for m in range(3):
        core.join(m, 0.0)
    out = []
    for m in range(3):
        out += core.receive(contribution(m, [-1.0, -2.0], version=0), now=1.0)
    assert "Merged" in kinds(out)
    # the mean (-1, -2), lr 0.5 * (1 + 0.5 * 2) = 1: w = (1, 2); without k it would be (0.5, 1)
    assert torch.allclose(core.params["w"], torch.tensor([1.0, 2.0]))


def test_the_check_uses_the_step_s_lr():
    """The finite check (run before the step, maybe in another thread) bounds the step as taken."""
    opt = NesterovOuterOptimizer(lr=1.0, momentum=0.0, lr_per_learner=1e6)
    params, scaled = {"w": torch.tensor([1e38])}, {"w": (torch.tensor([-1e33]), 1.0)}
    opt.check(params, scaled, contributions=1)  # 1e38 + 1e33: finite
    with pytest.raises(FloatingPointError):
        opt.check(params, scaled, contributions=3)  # 1e38 + 2e6 * 1e33: not
    # in the core: the round of 3 is refused whole, the fragment untouched (never non-finite)
    config = AlgorithmConfig(
        fragments=1,
        sync_every=4,
        quorum=3,
        grace=0.0,
        outer_lr=1.0,
        outer_momentum=0.0,
        merge="mean",
        max_outer_norm_ratio=0.0,
        outer_lr_per_learner=1e6,
    )
    core = SynchronizerCore(config, balanced_fragments([("w", 1)], 1), {"w": torch.tensor([1e38])})
    for m in range(3):
        core.join(m, 0.0)
    out = []
    for m in range(3):
        out += core.receive(contribution(m, [-1e33], version=0), now=1.0)
    assert kinds(out).count("Rejected") == 3 and "Merged" not in kinds(out)
    assert core.versions[0] == 0 and torch.equal(core.params["w"], torch.tensor([1e38]))


def test_the_step_count_is_saved_and_restored_and_guessed_from_the_version_when_missing():
    config = AlgorithmConfig(fragments=1, sync_every=4, outer_momentum=0.5, outer_debias=True)
    plan = balanced_fragments([("w", 1)], 1)
    state = SyncState(config, plan, [0], {"w": torch.zeros(1)})
    for _ in range(3):
        state.step(0, {"w": (torch.ones(1), 1.0)}, True, [0])
    state.step(0, {"w": (torch.ones(1), 1.0)}, False, [0])  # a plain step: not counted
    saved = state.state_dict()
    assert saved["outer_steps"] == {0: 3} and saved["versions"] == {0: 4}
    back = SyncState(config, plan, [0], {"w": torch.zeros(1)})
    back.load_state_dict(saved)
    assert back.outer[0].steps == 3
    back.load_state_dict({k: v for k, v in saved.items() if k != "outer_steps"})  # saved before the count
    assert back.outer[0].steps == 4


@pytest.mark.parametrize(
    ("field", "value", "flag"),
    [
        ("outer_debias", "yes", "--outer-debias"),
        ("outer_restart_every", -1, "--outer-restart-every"),
        ("outer_restart_every", 1.5, "--outer-restart-every"),
        ("outer_lr_per_learner", -0.1, "--outer-lr-per-learner"),
        ("outer_lr_per_learner", float("nan"), "--outer-lr-per-learner"),
    ],
)
def test_out_of_range_values_are_refused_in_one_line_naming_the_flag(field, value, flag):
    with pytest.raises(ValueError, match=flag) as caught:
        AlgorithmConfig(**{field: value})
    assert "\n" not in str(caught.value)
