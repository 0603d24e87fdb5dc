"""Fragments from module names on a llama-shaped stand-in (plain torch, no torchtitan): by hand, torchft's
layout (embeddings with the first layers, norm and head with the last, the rest split evenly); and end to
end, a synchronizer given them and a learner in its own process whose fragments and merges follow them."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import torch
from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import checkpoint_wrapper

import ddiloco
from ddiloco.core import plan_for_model
from ddiloco.integrations.fragments import clean_name, layer_fragments, module_fragments, parameter_fragments

from . import layer_learner


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


@pytest.mark.timeout(120)
def test_a_synchronizer_given_layer_fragments_hands_them_to_a_learner_and_merges_by_them(tmp_path, corpus_file):
    """The synchronizer owns the split: given `layer_fragments`, its plan is the module names' (not the
    balanced one), a learner in another process registers and receives exactly those fragments, and
    each fragment's merges come back as that fragment's layers, at its own staggered steps."""
    model = layer_learner.build()  # tok_embeddings, layers.0-3, norm + output: 6 units
    fragments = layer_fragments(model, 3)
    assert fragments == [
        [
            "tok_embeddings.weight",
            *[f"layers.{i}.{m}.{w}" for i in (0,) for m in ("norm", "mlp") for w in ("weight", "bias")],
        ],
        [f"layers.{i}.{m}.{w}" for i in (1, 2) for m in ("norm", "mlp") for w in ("weight", "bias")],
        [
            *[f"layers.3.{m}.{w}" for m in ("norm", "mlp") for w in ("weight", "bias")],
            "norm.weight",
            "norm.bias",
            "output.weight",
            "output.bias",
        ],
    ]
    balanced = plan_for_model(dict(model.named_parameters()), 3)
    assert [list(n) for n in balanced.names] != fragments  # without them the synchronizer would split otherwise
    out, steps = tmp_path / "learner.json", 30
    sync = ddiloco.Synchronizer(
        model, learners=1, fragments=fragments, sync_every=6, overlap=0, quorum=1, grace=0.0, heartbeat=0.1
    )
    assert sync.algorithm.fragments == 3 and [list(n) for n in sync.service.core.plan.names] == fragments
    with sync:
        done = subprocess.run(
            [sys.executable, layer_learner.__file__, sync.address, corpus_file, str(steps), str(out)],
            capture_output=True,
            text=True,
            timeout=100,
        )
        status = sync.status()
    assert done.returncode == 0, done.stderr[-3000:]
    got = json.loads(out.read_text())
    assert got["names"] == fragments and got["steps"] == steps and got["accepted"] > 0
    assert all(v >= 2 for v in status["versions"].values()), status["versions"]  # each fragment merged
    first = {p: next(s for s, applied in enumerate(got["applied"]) if p in applied) for p in range(3)}
    # blocking syncs (overlap 0): each fragment's merge comes back at its own step of the staggered schedule
    assert len(set(first.values())) == 3, got["applied"]
    assert all(len(applied) <= 1 for applied in got["applied"]), got["applied"]


def test_fragments_by_name_are_checked_where_the_synchronizer_takes_them():
    model = layer_learner.build()
    groups = layer_fragments(model, 3)
    with pytest.raises(ValueError, match="not a parameter"):
        ddiloco.Synchronizer(model, fragments=[*groups[:2], [*groups[2], "layers.9.mlp.weight"]], sync_every=6)
    with pytest.raises(ValueError, match="in fragments 0 and 1"):
        ddiloco.Synchronizer(model, fragments=[groups[0], [*groups[1], groups[0][0]], groups[2]], sync_every=6)
    with pytest.raises(ValueError, match="in no fragment"):
        ddiloco.Synchronizer(model, fragments=groups[:2], sync_every=6)
    with pytest.raises(ValueError, match="names no parameter"):
        ddiloco.Synchronizer(model, fragments=[*groups, []], sync_every=6)
    with pytest.raises(ValueError, match=r"fragments \(P=3\) must be <= sync_every"):
        ddiloco.Synchronizer(model, fragments=groups, sync_every=2)
