"""Balanced tensor fragmentation: whole tensors bin-packed into P fragments of nearly equal size.

The paper's best scheme: same quality as layer-wise fragments and the smoothest peak bandwidth.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
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
