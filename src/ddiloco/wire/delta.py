"""Differences sent down against what a learner already holds (`codec_down` int8 / int4): the one
piece of arithmetic the synchronizer and its learners must do identically."""

from __future__ import annotations

from collections.abc import Mapping

import torch

DELTA_CODECS = ("int8", "int4")


def apply_delta(held: Mapping[str, torch.Tensor], received: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """S_{v+1} = bf16(S_v + dq(q)): elementwise float32, so both sides get the same bits."""
    if set(held) != set(received):
        raise ValueError(f"a difference for {sorted(received)[:3]} does not match the held {sorted(held)[:3]}")
    return {n: (held[n].float() + received[n].float()).to(torch.bfloat16) for n in held}
