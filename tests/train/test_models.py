from __future__ import annotations

import pytest
import torch
from torch import nn

from ddiloco.train.gpt import EMBEDDING_NAMES, GPT, GPTConfig
from ddiloco.train.tasks import count_parameters, gpt_config, make_task


def test_default_dense_gpt_is_about_1m_parameters() -> None:
    n = count_parameters(GPT(gpt_config("gpt", "default")))
    assert 700_000 <= n <= 1_500_000, n


def test_default_moe_gpt_is_1_to_2m_parameters() -> None:
    cfg = gpt_config("gpt-moe", "default")
    assert cfg.num_experts == 4 and cfg.top_k == 2
    n = count_parameters(GPT(cfg))
    assert 1_000_000 <= n <= 2_000_000, n


def test_count_parameters_counts_scalars() -> None:
    model = nn.Linear(3, 5)
    assert count_parameters(model) == 3 * 5 + 5
    model.bias.requires_grad_(False)
    assert count_parameters(model, trainable_only=True) == 15


@pytest.mark.parametrize("name", ["gpt", "gpt-moe"])
def test_state_is_exactly_the_named_parameters(name: str) -> None:
    model = GPT(gpt_config(name, "tiny", seq_len=16))
    assert list(model.buffers()) == []
    assert set(model.state_dict()) == {n for n, _ in model.named_parameters()}
    assert not any(isinstance(m, nn.modules.batchnorm._BatchNorm) for m in model.modules())
    assert {n for n, _ in model.named_parameters()} >= EMBEDDING_NAMES


def test_vision_state_is_exactly_the_named_parameters() -> None:
    model = make_task("vision", model_size="tiny").build_model(0)
    assert list(model.buffers()) == []
    assert set(model.state_dict()) == {n for n, _ in model.named_parameters()}
    assert not any(isinstance(m, nn.modules.batchnorm._BatchNorm) for m in model.modules())


def test_attention_is_causal() -> None:
    torch.manual_seed(0)
    model = GPT(GPTConfig(vocab_size=50, seq_len=12, d_model=16, n_layers=2, n_heads=2)).eval()
    x = torch.randint(0, 50, (2, 12))
    y = x.clone()
    y[:, 7:] = (y[:, 7:] + 1) % 50  # change only the future
    with torch.no_grad():
        a, b = model(x), model(y)
    assert a.shape == (2, 12, 50)
    torch.testing.assert_close(a[:, :7], b[:, :7])
    assert not torch.allclose(a[:, 7:], b[:, 7:])


def test_sequence_longer_than_seq_len_raises() -> None:
    model = GPT(GPTConfig(vocab_size=10, seq_len=4, d_model=8, n_layers=1, n_heads=2))
    with pytest.raises(ValueError, match="seq_len"):
        model(torch.zeros(1, 5, dtype=torch.long))


def test_dense_aux_loss_is_zero_and_model_deep_copies() -> None:
    import copy

    model = GPT(gpt_config("gpt", "tiny", seq_len=8))
    logits, aux = model(torch.zeros(2, 8, dtype=torch.long), return_aux=True)
    assert float(aux) == 0.0
    copy.deepcopy(model)  # nothing with a graph is kept on the module


def test_config_validation() -> None:
    with pytest.raises(ValueError, match="divisible"):
        GPTConfig(d_model=30, n_heads=4)
    with pytest.raises(ValueError, match="top_k"):
        GPTConfig(num_experts=2, top_k=3)


@pytest.mark.parametrize("name", ["gpt", "gpt-moe", "vision"])
def test_build_model_is_deterministic_and_keeps_global_rng(name: str, shakespeare: str) -> None:
    task = make_task(name, None if name == "vision" else shakespeare, model_size="tiny", seq_len=32)
    torch.manual_seed(123)
    expected_next = torch.rand(3)
    torch.manual_seed(123)
    a, b, c = task.build_model(7), task.build_model(7), task.build_model(8)
    assert torch.equal(torch.rand(3), expected_next)  # building did not consume the caller's RNG
    pa, pb, pc = (dict(m.named_parameters()) for m in (a, b, c))
    assert all(torch.equal(pa[k], pb[k]) for k in pa)
    assert any(not torch.equal(pa[k], pc[k]) for k in pa)
