"""The values a fresh learner starts with, offered to the synchronizer so that it need not send what
the learner built itself (`wire.digest`)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

import torch

from ..wire.digest import value_digests
from ..wire.framing import WireError


class InitialValues:
    """The digests sent with the first registration, and the values they stand for."""

    def __init__(self, params: Mapping[str, torch.Tensor]) -> None:
        self.params = params
        self.digests = value_digests(params)

    def take(self, names: Sequence[str]) -> dict[str, torch.Tensor]:
        """float32 host copies of `names`, checked against the digests sent: the synchronizer's "you
        hold it" is true only of the values this learner had when it registered."""
        unknown = [n for n in names if n not in self.digests]
        if unknown:
            raise WireError(f"told to keep tensors it never offered: {unknown[:3]}")
        values = {n: self.params[n].detach().to("cpu", torch.float32, copy=True) for n in names}
        if value_digests(values) != {n: self.digests[n] for n in names}:
            raise WireError("told to keep its initial values, but they changed since it registered")
        return values


def kept(initial: InitialValues | None, names: Iterable[str]) -> dict[str, torch.Tensor]:
    """The values of a "you hold it" update (`held`), which only a learner that offered them may get."""
    if initial is None:
        raise WireError("told to keep initial values it did not offer")
    return initial.take(list(names))
