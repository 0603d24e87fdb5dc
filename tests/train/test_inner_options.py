"""The inner-optimizer options (`train.inner.InnerConfig`, issue #47 item 1), each by hand: the default is
exactly the AdamW it always was; Muon takes the hidden matrices and AdamW the rest, as one optimizer
that the schedule, a learner's saved state and peer recovery all read; MT-DAO's slow momentum moves a
parameter by the numbers worked out here; the learning rate warms up again after each adoption."""

from __future__ import annotations

import pytest
import torch

from ddiloco.learner import peerstate
from ddiloco.learner.state import load_optimizer, optimizer_state, save_optimizer
from ddiloco.train.gpt import GPT, GPTConfig
from ddiloco.train.inner import DEFAULT_LR, InnerConfig, inner_step, lr_at, make_inner_optimizer, set_lr
from ddiloco.train.optimizers import MuonWithAdamW, SlowFastAdamW, fill_state, muon_matrices

HIDDEN = {
    "blocks.0.attn.qkv.weight",
    "blocks.0.attn.proj.weight",
    "blocks.0.mlp.fc.weight",
    "blocks.0.mlp.proj.weight",
}


def tiny_gpt(seed: int = 0) -> GPT:
    torch.manual_seed(seed)
    return GPT(GPTConfig(vocab_size=16, seq_len=8, d_model=8, n_layers=1, n_heads=2))


def one_step(model: torch.nn.Module, optimizer: torch.optim.Optimizer, seed: int = 1) -> None:
    """One inner step on a fixed batch (the same for every optimizer given the same seed)."""
    generator = torch.Generator().manual_seed(seed)
    idx = torch.randint(0, 16, (4, 8), generator=generator)
    logits = model(idx)
    assert isinstance(logits, torch.Tensor)
    loss = torch.nn.functional.cross_entropy(logits[:, :-1].reshape(-1, 16), idx[:, 1:].reshape(-1))
    inner_step(model, optimizer, loss, grad_clip=1.0)


def test_the_default_is_muon_at_its_own_lr_and_an_lr_given_is_kept():
    assert InnerConfig().optimizer == "muon" and InnerConfig().lr == DEFAULT_LR["muon"] == 1.2e-2
    assert InnerConfig(optimizer="adamw").lr == DEFAULT_LR["adamw"] == 3e-3  # each optimizer its own default
    assert InnerConfig(lr=5e-4).lr == InnerConfig(lr=5e-4, optimizer="adamw").lr == 5e-4
    assert isinstance(make_inner_optimizer(tiny_gpt(), InnerConfig()), MuonWithAdamW)


def test_adamw_is_exactly_torch_s_adamw_with_the_same_hyper_parameters():
    config = InnerConfig(optimizer="adamw")
    model = tiny_gpt()
    got = make_inner_optimizer(model, config)
    assert type(got) is torch.optim.AdamW
    before = torch.optim.AdamW(tiny_gpt().parameters(), lr=3e-3, betas=(0.9, 0.95), weight_decay=0.1)
    (group,), (want,) = got.param_groups, before.param_groups
    assert {k: v for k, v in group.items() if k != "params"} == {k: v for k, v in want.items() if k != "params"}
    assert all(p is q for p, q in zip(group["params"], model.parameters(), strict=True))


def test_adamw_steps_bit_for_bit_as_before():
    a, b = tiny_gpt(), tiny_gpt()
    one_step(a, make_inner_optimizer(a, InnerConfig(optimizer="adamw")))
    one_step(b, torch.optim.AdamW(b.parameters(), lr=3e-3, betas=(0.9, 0.95), weight_decay=0.1))
    for (name, p), q in zip(a.named_parameters(), b.parameters(), strict=True):
        assert torch.equal(p, q), name


def test_muon_takes_the_hidden_matrices_and_adamw_the_embeddings_head_and_vectors():
    model = tiny_gpt()
    names = {id(p): n for n, p in model.named_parameters()}
    assert {names[id(p)] for p in muon_matrices(model)} == HIDDEN
    optimizer = make_inner_optimizer(model, InnerConfig(optimizer="muon"))
    assert isinstance(optimizer, MuonWithAdamW)
    kinds = {n: optimizer.kind_of(p) for n, p in model.named_parameters()}
    assert {n for n, k in kinds.items() if k == "muon"} == HIDDEN
    assert kinds["tok_emb.weight"] == kinds["pos_emb.weight"] == kinds["head.weight"] == "adamw"
    assert kinds["blocks.0.ln1.weight"] == kinds["blocks.0.attn.qkv.bias"] == "adamw"
    assert isinstance(optimizer.muon, torch.optim.Muon) and isinstance(optimizer.adamw, torch.optim.AdamW)
    assert all(g["adjust_lr_fn"] == "match_rms_adamw" for g in optimizer.muon.param_groups)


def test_a_tied_head_is_an_embedding_and_a_model_without_hidden_matrices_gets_adamw():
    model = tiny_gpt()
    model.head.weight = model.tok_emb.weight  # tied: the head is the embedding
    assert all(p is not model.tok_emb.weight for p in muon_matrices(model))
    assert len(muon_matrices(model)) == len(HIDDEN)
    cnn = torch.nn.Sequential(torch.nn.Conv2d(1, 4, 3), torch.nn.Flatten(), torch.nn.Linear(4, 2))
    assert muon_matrices(cnn) == []  # a convolution is 4-D, the only Linear is the head
    assert type(make_inner_optimizer(cnn, InnerConfig(optimizer="muon"))) is torch.optim.AdamW


def test_one_muon_step_differs_from_adamw_s_on_the_matrices_only():
    a, b = tiny_gpt(), tiny_gpt()
    one_step(a, make_inner_optimizer(a, InnerConfig(optimizer="muon", lr=3e-3)))
    one_step(b, make_inner_optimizer(b, InnerConfig(optimizer="adamw")))
    start = dict(tiny_gpt().named_parameters())
    for (name, p), q in zip(a.named_parameters(), b.parameters(), strict=True):
        if name in HIDDEN:
            assert not torch.allclose(p, q), name
            assert not torch.equal(p, start[name]), name  # Muon did step it
        else:
            assert torch.equal(p, q), name  # the same AdamW step


def test_the_schedule_sets_both_optimizers_learning_rate():
    model = tiny_gpt()
    optimizer = make_inner_optimizer(model, InnerConfig(optimizer="muon"))
    assert isinstance(optimizer, MuonWithAdamW) and optimizer.adamw is not None
    set_lr(optimizer, 0.0)
    for group in [*optimizer.muon.param_groups, *optimizer.adamw.param_groups]:
        assert group["lr"] == 0.0
    start = {n: p.detach().clone() for n, p in model.named_parameters()}
    one_step(model, optimizer)  # lr 0: nothing moves (weight decay is lr-scaled too)
    assert all(torch.equal(p, start[n]) for n, p in model.named_parameters())


def test_step_hooks_see_the_one_optimizer():
    model = tiny_gpt()
    optimizer = make_inner_optimizer(model, InnerConfig(optimizer="muon"))
    calls: list[object] = []
    optimizer.register_step_post_hook(lambda opt, args, kwargs: calls.append(opt))
    one_step(model, optimizer)
    assert calls == [optimizer]


def test_a_saved_state_loads_into_a_fresh_optimizer_and_steps_the_same(tmp_path):
    """A learner's saved inner state (`learner.state`: safetensors + JSON) restores both optimizers."""
    a, b = tiny_gpt(), tiny_gpt()
    opt_a = make_inner_optimizer(a, InnerConfig(optimizer="muon"))
    one_step(a, opt_a)
    save_optimizer(tmp_path, *optimizer_state(opt_a, 1))
    with torch.no_grad():
        for p, q in zip(b.parameters(), a.parameters(), strict=True):
            p.copy_(q)
    opt_b = make_inner_optimizer(b, InnerConfig(optimizer="muon"))
    assert load_optimizer(tmp_path, opt_b) == 1
    assert isinstance(opt_b, MuonWithAdamW)
    assert opt_b.muon.state is opt_b.state and opt_b.muon.param_groups[0] is opt_b.param_groups[0]
    one_step(a, opt_a, seed=2)
    one_step(b, opt_b, seed=2)
    for (name, p), q in zip(a.named_parameters(), b.parameters(), strict=True):
        assert torch.equal(p, q), name


def test_peer_recovery_carries_both_states():
    a, b = tiny_gpt(), tiny_gpt()
    opt_a = make_inner_optimizer(a, InnerConfig(optimizer="muon"))
    one_step(a, opt_a)
    tensors, scalars = peerstate.snapshot(opt_a, dict(a.named_parameters()))
    assert "blocks.0.mlp.fc.weight/momentum_buffer" in tensors and "head.weight/exp_avg" in tensors
    opt_b = make_inner_optimizer(b, InnerConfig(optimizer="muon"))
    assert peerstate.load(opt_b, dict(b.named_parameters()), tensors, scalars) == 1
    got, _ = peerstate.snapshot(opt_b, dict(b.named_parameters()))
    assert got.keys() == tensors.keys() and all(torch.equal(got[k], tensors[k]) for k in tensors)


def test_an_unknown_inner_optimizer_is_refused():
    with pytest.raises(ValueError, match="adamw, muon"):
        InnerConfig(optimizer="sgd")  # type: ignore[arg-type]


def slow_fast_steps(grads: list[float], **config: float) -> list[float]:
    """The 1-element parameter (starting at 1.0) after each step of `SlowFastAdamW` on these gradients."""
    theta = torch.nn.Parameter(torch.tensor([1.0]))
    defaults = {"lr": 0.1, "betas": (0.5, 0.75), "slow_beta": 0.9, "slow_weight": 0.5, "weight_decay": 0.0}
    optimizer = SlowFastAdamW([theta], **{**defaults, **config})  # type: ignore[arg-type]
    out = []
    for g in grads:
        theta.grad = torch.tensor([g])
        optimizer.step()
        out.append(float(theta.detach()))
    return out


def test_the_slow_momentum_moves_a_parameter_by_the_hand_computed_amounts():
    """lr 0.1, beta1 0.5, beta2 0.75, beta_s 0.9, w 0.5; gradients 2 then -1.
    Step 1: m_f = 1, m_s = 0.2, v = 1; bias-corrected 2, 2, 4: theta = 1 - 0.1 * 2 / 2 = 0.9.
    Step 2: m_f = 0.5 - 0.5 = 0, m_s = 0.18 - 0.1 = 0.08, v = 0.75 + 0.25 = 1; corrected 0, 0.08 / 0.19,
    1 / 0.4375: theta = 0.9 - 0.1 * 0.5 * (0.08 / 0.19) / sqrt(1 / 0.4375) = 0.886075.
    AdamW (w 0) stops at 0.9: its fast momentum cancelled, the slow one remembers the first gradient."""
    got = slow_fast_steps([2.0, -1.0])
    assert got == pytest.approx([0.9, 0.9 - 0.1 * 0.5 * (0.08 / 0.19) / (1 / 0.4375) ** 0.5], abs=1e-6)
    assert got[1] == pytest.approx(0.886075, abs=1e-6)
    assert slow_fast_steps([2.0, -1.0], slow_weight=0.0) == pytest.approx([0.9, 0.9], abs=1e-6)
    # decoupled weight decay, as AdamW's: theta (1 - lr * lambda) first, 1 * 0.99 - 0.1 = 0.89
    assert slow_fast_steps([2.0], weight_decay=0.1) == pytest.approx([0.89], abs=1e-6)


def test_slow_weight_zero_is_adamw():
    a, b = tiny_gpt(), tiny_gpt()
    config = InnerConfig(slow_momentum=0.99, slow_weight=0.0, optimizer="adamw")
    opt_a, opt_b = make_inner_optimizer(a, config), make_inner_optimizer(b, InnerConfig(optimizer="adamw"))
    assert isinstance(opt_a, SlowFastAdamW)
    for seed in range(3):
        one_step(a, opt_a, seed)
        one_step(b, opt_b, seed)
    for (name, p), q in zip(a.named_parameters(), b.parameters(), strict=True):
        assert torch.allclose(p, q, atol=1e-6), name


def test_the_slow_momentum_is_an_option_of_the_config_and_its_state_saves(tmp_path):
    a, b = tiny_gpt(), tiny_gpt()
    config = InnerConfig(slow_momentum=0.99, optimizer="adamw")
    opt_a = make_inner_optimizer(a, config)
    assert isinstance(opt_a, SlowFastAdamW) and opt_a.param_groups[0]["slow_beta"] == 0.99
    one_step(a, opt_a)
    tensors, _ = peerstate.snapshot(opt_a, dict(a.named_parameters()))
    assert "head.weight/exp_avg_slow" in tensors
    save_optimizer(tmp_path, *optimizer_state(opt_a, 1))
    with torch.no_grad():
        for p, q in zip(b.parameters(), a.parameters(), strict=True):
            p.copy_(q)
    opt_b = make_inner_optimizer(b, config)
    assert load_optimizer(tmp_path, opt_b) == 1
    one_step(a, opt_a, seed=2)
    one_step(b, opt_b, seed=2)
    for (name, p), q in zip(a.named_parameters(), b.parameters(), strict=True):
        assert torch.equal(p, q), name


@pytest.mark.parametrize(
    "bad",
    [
        {"slow_momentum": 0.5, "optimizer": "adamw"},
        {"slow_momentum": 1.0, "optimizer": "adamw"},
        {"slow_weight": 1.5},
        {"slow_momentum": 0.99, "optimizer": "muon"},
    ],
)
def test_a_slow_momentum_that_is_not_slower_or_is_mixed_with_muon_is_refused(bad):
    with pytest.raises(ValueError, match="slow"):
        InnerConfig(**bad)


def test_the_learning_rate_warms_up_again_linearly_after_an_adoption():
    """R = 4 re-warm steps on a flat schedule (no warm-up, no decay): lr x (since + 1) / 4 up to lr."""
    flat = InnerConfig(lr=1.0, warmup_steps=0, min_lr_ratio=1.0, rewarm_steps=4)
    assert [lr_at(flat, 100, 0.5, since) for since in range(6)] == [0.25, 0.5, 0.75, 1.0, 1.0, 1.0]
    assert lr_at(flat, 100, 0.5, None) == 1.0  # never adopted (data-parallel training): no re-warm-up
    off = InnerConfig(lr=1.0, warmup_steps=0, min_lr_ratio=1.0)
    assert lr_at(off, 100, 0.5, 0) == 1.0  # rewarm_steps 0: adoptions leave the schedule alone
    # with the first warm-up (10 steps) and the cosine decay: the lower warm-up factor, times the decay
    full = InnerConfig(lr=1.0, warmup_steps=10, min_lr_ratio=0.0, rewarm_steps=4)
    assert lr_at(full, 0, 0.0, 3) == pytest.approx(0.1)  # step 1 of 10: the first warm-up is lower
    assert lr_at(full, 9, 0.0, 0) == pytest.approx(0.25)  # warmed up, just adopted: 1 / 4
    assert lr_at(full, 50, 0.5, 1) == pytest.approx(0.5 * 0.5)  # 2 / 4 of the cosine's half at mid-run
    with pytest.raises(ValueError, match="rewarm_steps"):
        InnerConfig(rewarm_steps=-1)


@pytest.mark.parametrize(
    "inner", [{"optimizer": "adamw"}, {"optimizer": "muon"}, {"slow_momentum": 0.99, "optimizer": "adamw"}]
)
def test_an_empty_optimizer_gets_the_state_its_first_step_makes(inner):
    """What a data-parallel job's ranks receive rank 0's state into (`dataparallel.replicated`)."""
    empty, trained = tiny_gpt(), tiny_gpt()
    opt_empty = make_inner_optimizer(empty, InnerConfig(**inner))
    opt_trained = make_inner_optimizer(trained, InnerConfig(**inner))
    fill_state(opt_empty)
    one_step(trained, opt_trained)
    for (name, p), q in zip(empty.named_parameters(), trained.parameters(), strict=True):
        mine, theirs = opt_empty.state[p], opt_trained.state[q]
        assert sorted(mine) == sorted(theirs), name
        assert all(mine[k].shape == theirs[k].shape and mine[k].dtype == theirs[k].dtype for k in mine), name
    one_step(empty, opt_empty)  # the prepared state is taken as the optimizer's own: the same first step
    for (name, p), q in zip(empty.named_parameters(), trained.parameters(), strict=True):
        assert torch.equal(p, q), name
