from __future__ import annotations

import math

import pytest
import torch

from ddiloco.train.gpt import GPT
from ddiloco.train.moe import MoEMLP, load_balancing_loss
from ddiloco.train.tasks import gpt_config, make_task


def test_topk_gates_sum_to_one() -> None:
    torch.manual_seed(0)
    layer = MoEMLP(d_model=16, hidden=32, num_experts=4, top_k=2)
    x = torch.randn(50, 16) * 5
    gates, idx, probs = layer.route(x)
    assert gates.shape == (50, 2) and idx.shape == (50, 2) and probs.shape == (50, 4)
    torch.testing.assert_close(gates.sum(-1), torch.ones(50))
    assert bool((gates > 0).all())
    assert bool((idx[:, 0] != idx[:, 1]).all())
    # the chosen experts are the two most probable, with gates their renormalised probabilities
    top = probs.topk(2, dim=-1)
    assert torch.equal(idx, top.indices)
    torch.testing.assert_close(gates, top.values / top.values.sum(-1, keepdim=True))


def test_aux_loss_uniform_routing_hand_made() -> None:
    # 8 tokens, 4 experts, top-1: token t goes to expert t % 4 and every router probability is 1/4.
    e = 4
    probs = torch.full((8, e), 1.0 / e)
    idx = (torch.arange(8) % e).unsqueeze(-1)
    aux = load_balancing_loss(probs, idx, e)
    # num_experts * sum_i f_i * P_i = 4 * 4 * (1/4 * 1/4) = 1: the minimum, perfectly balanced.
    assert math.isclose(float(aux), 1.0, rel_tol=1e-6)


def test_aux_loss_collapsed_routing_is_num_experts() -> None:
    e = 4
    probs = torch.zeros(8, e)
    probs[:, 0] = 1.0
    idx = torch.zeros(8, 1, dtype=torch.long)
    assert math.isclose(float(load_balancing_loss(probs, idx, e)), float(e), rel_tol=1e-6)
    # partly collapsed (two experts share everything, top-2) lies strictly in between
    probs2 = torch.zeros(8, e)
    probs2[:, :2] = 0.5
    idx2 = torch.tensor([[0, 1]] * 8)
    aux2 = float(load_balancing_loss(probs2, idx2, e))
    assert 1.0 < aux2 < e
    assert math.isclose(aux2, 2.0, rel_tol=1e-6)


def test_aux_loss_gradient_reaches_router() -> None:
    torch.manual_seed(0)
    layer = MoEMLP(d_model=8, hidden=16, num_experts=4, top_k=2)
    _, aux = layer(torch.randn(3, 5, 8))
    aux.backward()
    assert layer.router.weight.grad is not None and layer.router.weight.grad.abs().sum() > 0


def test_moe_output_matches_per_token_reference() -> None:
    torch.manual_seed(1)
    layer = MoEMLP(d_model=8, hidden=16, num_experts=3, top_k=2)
    x = torch.randn(2, 6, 8)
    out, _ = layer(x)
    flat = x.reshape(-1, 8)
    gates, idx, _ = layer.route(flat)
    ref = torch.stack(
        [sum(gates[t, j] * layer.experts[int(idx[t, j])](flat[t]) for j in range(2)) for t in range(len(flat))]
    )
    torch.testing.assert_close(out.reshape(-1, 8), ref)


def test_task_loss_includes_aux(shakespeare: str) -> None:
    task = make_task("gpt-moe", shakespeare, model_size="tiny", seq_len=32)
    model = task.build_model(0)
    batch = task.stream(0, 1, 4, 0).next()
    logits, aux = model(batch.inputs, return_aux=True)
    ce = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.size(-1)), batch.targets.reshape(-1))
    assert float(aux.detach()) >= 1.0 - 1e-5  # the balancing loss is never below its uniform value
    expected = ce + task.config.aux_loss_coef * aux
    torch.testing.assert_close(task.loss(model, batch), expected)
    assert task.config.aux_loss_coef > 0
    assert model.last_aux_loss is not None and not model.last_aux_loss.requires_grad


def test_moe_rejects_bad_top_k() -> None:
    with pytest.raises(ValueError):
        MoEMLP(8, 16, num_experts=2, top_k=3)


def test_moe_model_has_router_and_experts() -> None:
    names = {n for n, _ in GPT(gpt_config("gpt-moe", "tiny", seq_len=8)).named_parameters()}
    assert "blocks.0.mlp.router.weight" in names
    assert "blocks.1.mlp.experts.3.fc.weight" in names
