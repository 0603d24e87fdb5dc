"""Fragments from module names on a llama-shaped stand-in (plain torch, no torchtitan): by hand, torchft's
layout (embeddings with the first layers, norm and head with the last, the rest split evenly)."""

from __future__ import annotations

import pytest
import torch
from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import checkpoint_wrapper

from ddiloco.integrations.fragments import clean_name, module_fragments, parameter_fragments


class Block(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.attention = torch.nn.Linear(4, 4)
        self.norm = torch.nn.LayerNorm(4)


class Stand(torch.nn.Module):
    def __init__(self, layers: int = 6, as_dict: bool = True) -> None:
        super().__init__()
        self.tok_embeddings = torch.nn.Embedding(8, 4)
        blocks = [Block() for _ in range(layers)]
        self.layers = (
            torch.nn.ModuleDict({str(i): b for i, b in enumerate(blocks)}) if as_dict else torch.nn.ModuleList(blocks)
        )
        self.norm = torch.nn.LayerNorm(4)
        self.lm_head = torch.nn.Linear(4, 8)


@pytest.mark.parametrize("as_dict", [True, False], ids=["ModuleDict", "ModuleList"])
def test_modules_and_parameters_per_fragment_by_hand(as_dict):
    model = Stand(as_dict=as_dict)
    modules = module_fragments(model, 3)  # 8 units (embeddings, 6 layers, norm+head): 3, 3, 2
    assert modules == [
        ["tok_embeddings", "layers.0", "layers.1"],
        ["layers.2", "layers.3", "layers.4"],
        ["layers.5", "norm", "lm_head"],
    ]
    assert module_fragments(model, 1) == [["tok_embeddings", *[f"layers.{i}" for i in range(6)], "norm", "lm_head"]]
    params = parameter_fragments(model, modules)
    assert params[0][:3] == ["tok_embeddings.weight", "layers.0.attention.weight", "layers.0.attention.bias"]
    assert params[2][-4:] == ["norm.weight", "norm.bias", "lm_head.weight", "lm_head.bias"]
    assert sorted(n for f in params for n in f) == sorted(n for n, _ in model.named_parameters())


def test_wrapped_layers_keep_their_plain_names():
    plain, wrapped = Stand(), Stand()
    for key, layer in list(wrapped.layers.named_children()):
        wrapped.layers.register_module(key, checkpoint_wrapper(layer))
    raw = [n for n, _ in wrapped.named_parameters()]
    assert "layers.0._checkpoint_wrapped_module.attention.weight" in raw
    assert [clean_name(n) for n in raw] == [n for n, _ in plain.named_parameters()]
    modules = module_fragments(wrapped, 4)
    assert parameter_fragments(wrapped, modules) == parameter_fragments(plain, modules)


def test_impossible_layouts_are_refused():
    with pytest.raises(ValueError, match="9 fragments for 8 units"):
        module_fragments(Stand(), 9)
    with pytest.raises(ValueError, match="one list of layers"):
        module_fragments(torch.nn.Linear(2, 2), 1)
    with pytest.raises(ValueError, match="belongs to no fragment"):
        parameter_fragments(Stand(), [["tok_embeddings"], ["layers.0"]])
