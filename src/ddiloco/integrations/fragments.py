"""A model's fragments from its module names, for layer-wise fragments as torchft's `fragment_llm` makes
them: the modules before the list of layers (embeddings) go with the first layers, those after it (final
norm, output head) with the last, each counting as one layer, and the layers are split evenly, the first
fragments taking one more where they do not divide. Plain torch: tested without torchtitan installed.

The synchronizer owns the split (learners take it at registration): give it the layer-wise one as
`ddiloco.Synchronizer(model, fragments=layer_fragments(model, P))` (without, it balances by size).
"""

from __future__ import annotations

import re

import torch

WRAPPERS = re.compile(r"(_checkpoint_wrapped_module|_orig_mod|_fsdp_wrapped_module)\.")


def clean_name(name: str) -> str:
    """A parameter's name without activation-checkpoint, compile or FSDP1 wrapper parts."""
    return WRAPPERS.sub("", name)


def module_fragments(model: torch.nn.Module, num_fragments: int) -> list[list[str]]:
    """Top-level module names per fragment: the first fragment takes the modules before the layer
    list (embeddings), the last those after it (norm, head), each counting as one layer."""
    children = list(model.named_children())
    stacks = [i for i, (_, m) in enumerate(children) if isinstance(m, (torch.nn.ModuleList, torch.nn.ModuleDict))]
    if len(stacks) != 1:
        raise ValueError(f"expected one list of layers among {[n for n, _ in children]}, found {len(stacks)}")
    at = stacks[0]
    name, layers = children[at]
    keys = [k for k, _ in layers.named_children()]  # ModuleDict keys, or ModuleList indices
    units: list[list[str]] = [[n for n, _ in children[:at]]] if at else []
    units += [[f"{name}.{k}"] for k in keys]
    if children[at + 1 :]:
        units.append([n for n, _ in children[at + 1 :]])
    if not 1 <= num_fragments <= len(units):
        raise ValueError(f"{num_fragments} fragments for {len(units)} units (layers, input and output modules)")
    per, extra = divmod(len(units), num_fragments)
    out, start = [], 0
    for f in range(num_fragments):
        end = start + per + (1 if f < extra else 0)
        out.append([m for unit in units[start:end] for m in unit])
        start = end
    return out


def parameter_fragments(model: torch.nn.Module, modules: list[list[str]]) -> list[list[str]]:
    """Each (clean) parameter name in the fragment of the module it lives in; every one exactly once."""
    owner = {m: f for f, names in enumerate(modules) for m in names}
    out: list[list[str]] = [[] for _ in modules]
    for raw, _ in model.named_parameters():
        name = clean_name(raw)
        parts = name.split(".")
        keys = [".".join(parts[:2]), parts[0]]
        fragment = next((owner[k] for k in keys if k in owner), None)
        if fragment is None:
            raise ValueError(f"parameter {name} belongs to no fragment's module")
        out[fragment].append(name)
    return out


def layer_fragments(model: torch.nn.Module, num_fragments: int) -> list[list[str]]:
    """The (clean) parameter names of each layer-wise fragment: what the synchronizer takes as
    `ddiloco.Synchronizer(model, fragments=layer_fragments(model, P))`. The synchronizer owns the
    split; learners receive it when they register, so every learner's fragments follow these names."""
    return parameter_fragments(model, module_fragments(model, num_fragments))
