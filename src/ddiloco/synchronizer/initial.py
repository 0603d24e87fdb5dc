"""An --init safetensors file read one tensor at a time, each when a shard asks for it.

A shard keeps only its own fragments, but reading the whole file first held every shard's copy of the
whole model at once: at 1B parameters, 4 shards each loading the 4 GB file peaked at 5 GB apiece for
the 1 GB they own (`benchmarks/synchronizer_scale.py --sizes 1e9`). The plan, the signature and the
shapes need only the file's header, which `shapes` gives as meta tensors (no memory); a value is read,
and checked finite, when it is looked up, and its mapping of the file closed at once.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from pathlib import Path

import torch
from safetensors import SafetensorError, safe_open

from .checkpoint import CheckpointError

#: safetensors' dtype names, for the meta tensors of `shapes` (anything else: float32, its size unused).
DTYPES = {
    "F64": torch.float64,
    "F32": torch.float32,
    "F16": torch.float16,
    "BF16": torch.bfloat16,
    "I64": torch.int64,
    "I32": torch.int32,
    "I16": torch.int16,
    "I8": torch.int8,
    "U8": torch.uint8,
    "BOOL": torch.bool,
}


class TensorFile(Mapping[str, torch.Tensor]):
    """The file's tensors by name, read when looked up (each lookup reads the file again)."""

    def __init__(self, path: str | Path, what: str = "--init file") -> None:
        self.path, self.what = Path(path), what
        try:
            with safe_open(str(self.path), "pt") as f:
                self.metadata: dict[str, str] = f.metadata() or {}
                self.shapes: dict[str, torch.Tensor] = {
                    name: torch.empty(
                        f.get_slice(name).get_shape(),
                        dtype=DTYPES.get(f.get_slice(name).get_dtype(), torch.float32),
                        device="meta",
                    )
                    for name in f.keys()  # noqa: SIM118  # safe_open is not a Mapping
                }
        except FileNotFoundError:
            raise CheckpointError(f"{self.path}: {what} is missing") from None
        except (SafetensorError, OSError, ValueError, RuntimeError) as exc:
            raise CheckpointError(f"{self.path}: not a readable safetensors {what} ({str(exc)[:200]})") from None

    def __getitem__(self, name: str) -> torch.Tensor:
        if name not in self.shapes:
            raise KeyError(name)
        try:
            with safe_open(str(self.path), "pt") as f:
                t = f.get_tensor(name)
        except (SafetensorError, OSError, ValueError, RuntimeError) as exc:
            raise CheckpointError(f"{self.path}: cannot read {name!r} of the {self.what} ({str(exc)[:200]})") from None
        if t.is_floating_point() and not bool(torch.isfinite(t).all()):
            raise CheckpointError(f"{self.path}: tensor {name!r} holds NaN or Inf values")
        return t

    def __contains__(self, name: object) -> bool:  # Mapping's own would read the tensor
        return name in self.shapes

    def __iter__(self) -> Iterator[str]:
        return iter(self.shapes)

    def __len__(self) -> int:
        return len(self.shapes)
