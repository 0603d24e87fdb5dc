"""What a learner holds of each fragment when updates come down as differences (`codec_down` int8
or int4): the shadow value S_v in bf16, to which the next difference is added (`wire.delta`)."""

from __future__ import annotations

from collections.abc import Mapping

import torch

from ..wire.delta import apply_delta
from ..wire.framing import WireError


class HeldValues:
    """Per fragment (version, bf16 values), kept only when the synchronizer sends differences."""

    def __init__(self) -> None:
        self.enabled = False
        self._held: dict[int, tuple[int, dict[str, torch.Tensor]]] = {}

    def reset(self, enabled: bool) -> None:
        """A new stream: its outbox sends each fragment whole before any difference."""
        self.enabled = enabled
        self._held.clear()

    def take(
        self, fragment: int, version: int, base: object, tensors: Mapping[str, torch.Tensor]
    ) -> dict[str, torch.Tensor]:
        """The fragment's value at `version` (float32) from a whole value (`base` None) or a difference."""
        if base is None:
            if self.enabled:
                self._held[fragment] = (version, {n: t.to(torch.bfloat16) for n, t in tensors.items()})
            return dict(tensors)
        held = self._held.get(fragment)
        if not self.enabled or not isinstance(base, int) or held is None or held[0] != base:
            have = None if held is None else held[0]
            raise WireError(
                f"a difference for fragment {fragment} from version {base!r}, but this learner holds {have}"
            )
        try:
            value = apply_delta(held[1], tensors)
        except ValueError as exc:
            raise WireError(str(exc)) from None
        self._held[fragment] = (version, value)
        return {n: t.float() for n, t in value.items()}
