"""Updates down as quantised differences (`codec_down` int8 or int4): what a learner already holds
is subtracted, the difference is quantised blockwise, and what the quantisation lost goes with the
next difference (error feedback), so nothing drifts.

Every learner of a fragment holds the same value, the shadow S_v: S_{v+1} = bf16(S_v + dq(q)) with
q = quantise(Theta_{v+1} - S_v), computed here and by each learner from the same bytes (elementwise
float32 arithmetic, identical on both sides). The master copy Theta stays float32. A learner that
does not hold S_v (it joined, reconnected, or its outbox skipped a version) gets S_{v+1} whole in
bf16, which represents it exactly; the outbox picks which of the two it streams (`Outbox.get`).
"""

from __future__ import annotations

import threading
from collections.abc import Mapping

import torch

from ..wire import framing, quant
from ..wire.delta import DELTA_CODECS, apply_delta


class Encoded:
    """One version's update: as a difference from version `base` (None: there is none), and whole,
    encoded only if some learner needs it (most hold `base`), by the thread that streams it."""

    def __init__(
        self,
        head: Mapping,
        version: int,
        shadow: Mapping[str, torch.Tensor],
        chunk_bytes: int,
        base: int | None = None,
        delta: list[bytes] | None = None,
    ) -> None:
        self.version, self.base, self.delta = version, base, delta
        self.delta_nbytes = sum(map(len, delta)) if delta is not None else 0
        self.full_nbytes = sum(2 * t.numel() for t in shadow.values())  # bf16, before its headers
        self._args = (dict(head), shadow, chunk_bytes)  # the shadow of a version is never changed in place
        self._full: list[bytes] | None = None
        self._lock = threading.Lock()

    def full(self) -> list[bytes]:
        with self._lock:
            if self._full is None:
                head, shadow, chunk = self._args
                self._full = framing.tensor_frames(head, shadow, "bf16", chunk)
            return self._full


class DeltaDownlink:
    """The shadow per fragment (bf16, half the fp32 model in all) and its encodings."""

    def __init__(self, codec: str, chunk_bytes: int) -> None:
        if codec not in DELTA_CODECS:
            raise ValueError(f"a difference codec is one of {DELTA_CODECS}, got {codec!r}")
        self.codec = codec
        self.chunk_bytes = chunk_bytes
        self._shadow: dict[int, tuple[int, dict[str, torch.Tensor]]] = {}

    def encode(self, head: Mapping, fragment: int, version: int, tensors: Mapping[str, torch.Tensor]) -> Encoded:
        """The frames of `version`, whose global value is `tensors`; moves the shadow to it."""
        held = self._shadow.get(fragment)
        if held is not None and held[0] == version:  # a join or a reply: the value learners hold
            return Encoded(head, version, held[1], self.chunk_bytes)
        if held is None or held[0] > version:
            shadow = {n: t.detach().to(torch.bfloat16, copy=True) for n, t in tensors.items()}
            self._shadow[fragment] = (version, shadow)
            return Encoded(head, version, shadow, self.chunk_bytes)
        base, old = held
        with torch.no_grad():
            diff = {n: tensors[n].detach().float() - old[n].float() for n in tensors}
            specs, blobs = framing.encode_tensors(diff, self.codec)
            codec = quant.get(self.codec)  # what each learner will decode, blob by blob (no joined copy)
            shadow = apply_delta(old, {s.name: codec.decode(b, s.shape) for s, b in zip(specs, blobs, strict=True)})
        self._shadow[fragment] = (version, shadow)
        delta = framing.frames(
            dict(head, delta_from=base, tensors=[s.to_json() for s in specs]), blobs, self.chunk_bytes
        )
        return Encoded(head, version, shadow, self.chunk_bytes, base, delta)
