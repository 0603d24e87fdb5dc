"""Balanced tensor fragmentation: whole tensors bin-packed into P fragments of nearly equal size.

The paper's best scheme: same quality as layer-wise fragments and the smoothest peak bandwidth.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class FragmentPlan:
    """Which parameter tensors belong to which fragment, and how big each fragment is."""

    names: tuple[tuple[str, ...], ...]
    sizes: tuple[int, ...]

    @property
    def num_fragments(self) -> int:
        return len(self.names)

    @property
    def total_size(self) -> int:
        return sum(self.sizes)

    def share(self, fragment: int) -> float:
        """The fragment's share of all parameters (used to weigh per-fragment work)."""
        return self.sizes[fragment] / self.total_size

    def fragment_of(self, name: str) -> int:
        for index, names in enumerate(self.names):
            if name in names:
                return index
        raise KeyError(f"parameter {name!r} is in no fragment")

    def all_names(self) -> list[str]:
        return [n for names in self.names for n in names]


def balanced_fragments(numels: Mapping[str, int] | Sequence[tuple[str, int]], num_fragments: int) -> FragmentPlan:
    """Greedy bin-packing: largest tensor first, each into the currently lightest fragment.

    Ties are broken deterministically (tensor order as given, then lowest fragment index) so that
    every process computes the same plan from the same model. Within a fragment, tensors keep the
    order they had in the model.
    """
    items = list(numels.items()) if isinstance(numels, Mapping) else list(numels)
    if num_fragments < 1:
        raise ValueError(f"num_fragments must be >= 1, got {num_fragments}")
    if len(items) < num_fragments:
        raise ValueError(
            f"cannot split {len(items)} tensors into {num_fragments} fragments: "
            "use at most as many fragments as the model has parameter tensors"
        )
    if len({name for name, _ in items}) != len(items):
        raise ValueError("parameter names must be unique")
    order = {name: i for i, (name, _) in enumerate(items)}
    loads = [0] * num_fragments
    members: list[list[str]] = [[] for _ in range(num_fragments)]
    for name, numel in sorted(items, key=lambda item: (-item[1], order[item[0]])):
        lightest = min(range(num_fragments), key=lambda f: (loads[f], f))
        members[lightest].append(name)
        loads[lightest] += numel
    return FragmentPlan(
        names=tuple(tuple(sorted(m, key=order.__getitem__)) for m in members),
        sizes=tuple(loads),
    )


def plan_for_model(named_parameters: Mapping[str, torch.Tensor], num_fragments: int) -> FragmentPlan:
    """Plan from a name -> tensor mapping (e.g. dict(model.named_parameters()))."""
    return balanced_fragments([(n, int(t.numel())) for n, t in named_parameters.items()], num_fragments)


def named_fragments(
    numels: Mapping[str, int] | Sequence[tuple[str, int]], groups: Sequence[Sequence[str]]
) -> FragmentPlan:
    """The plan a caller chose by name (layer-wise fragments from module names, as torchft's): each
    group one fragment, in the order given. Every tensor must be in exactly one non-empty group; within
    a fragment, tensors keep the order they had in the model (as `balanced_fragments`)."""
    items = list(numels.items()) if isinstance(numels, Mapping) else list(numels)
    order = {name: i for i, (name, _) in enumerate(items)}
    if isinstance(groups, str) or not groups or any(isinstance(g, str) for g in groups):
        raise ValueError("fragments by name: give a list of fragments, each a list of parameter names")
    seen: dict[str, int] = {}
    for f, group in enumerate(groups):
        if not group:
            raise ValueError(f"fragment {f} names no parameter")
        for name in group:
            if name not in order:
                raise ValueError(f"fragment {f} names {name!r}, which is not a parameter of the model")
            if name in seen:
                raise ValueError(f"parameter {name!r} is in fragments {seen[name]} and {f}: each belongs to one")
            seen[name] = f
    missing = [name for name in order if name not in seen]
    if missing:
        raise ValueError(f"{len(missing)} parameters are in no fragment, e.g. {missing[:3]}")
    sizes = dict(items)
    members = [sorted(group, key=order.__getitem__) for group in groups]
    return FragmentPlan(
        names=tuple(tuple(m) for m in members),
        sizes=tuple(sum(int(sizes[n]) for n in m) for m in members),
    )


def plan_by_names(named_parameters: Mapping[str, torch.Tensor], groups: Sequence[Sequence[str]]) -> FragmentPlan:
    """`named_fragments` from a name -> tensor mapping."""
    return named_fragments([(n, int(t.numel())) for n, t in named_parameters.items()], groups)
