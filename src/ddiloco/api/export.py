"""The global model out of a run: from its checkpoints (`ddiloco export`, `export_global`,
`load_global`) or, during the run, from the shards themselves (`fetch_global`).

What comes out is a plain state dict (parameters only, the outer optimizer's buffers left out, tied
weights once under their `named_parameters` name), in safetensors; given a Hugging Face config, the
folder also holds config.json, so that `from_pretrained(folder)` loads it.
"""

from __future__ import annotations

import shutil
from collections.abc import Sequence
from pathlib import Path

import torch

from ..learner.fetch import fetch_params
from ..synchronizer.checkpoint import load_global_params

WEIGHTS = "model.safetensors"


def shard_dirs(source: str | Path) -> list[Path]:
    """The checkpoint folders of a run directory (sync-*/), or the checkpoint folder itself."""
    source = Path(source)
    if (source / "manifest.json").is_file():
        return [source]
    shards = sorted(p.parent for p in source.glob("sync-*/manifest.json"))
    if not shards:
        raise ValueError(f"{source} holds no synchronizer checkpoint (no manifest.json, no sync-*/manifest.json)")
    return shards


def load_global(source: str | Path) -> dict[str, torch.Tensor]:
    """The global parameters of a run or checkpoint folder, every shard's fragments together."""
    params, _ = load_global_params(shard_dirs(source))
    return params


def fetch_global(
    addresses: str | Sequence[str], token: str | None = None, timeout: float = 30.0
) -> dict[str, torch.Tensor]:
    """The current global parameters from the running shards (read-only; no learner slot taken)."""
    shards = [a.strip() for a in addresses.split(",")] if isinstance(addresses, str) else list(addresses)
    params = fetch_params(shards, token, timeout)
    if params is None:
        raise ConnectionError(f"a synchronizer of {shards} did not answer the fetch")
    return params


def export_global(source: str | Path, out: str | Path, hf_config: str | Path | object | None = None) -> Path:
    """Write `out/model.safetensors` (and `out/config.json` from a Hugging Face config: a folder, a
    config.json file or a transformers config object). Returns the weights file."""
    from safetensors.torch import save_file

    params = load_global(source)
    out = Path(out)
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise ValueError(f"--out {out}: cannot create it ({exc.strerror})") from None
    weights = out / WEIGHTS
    save_file({n: t.contiguous() for n, t in params.items()}, str(weights), metadata={"format": "pt"})
    if hf_config is not None:
        _write_config(hf_config, out)
    return weights


def _write_config(hf_config: str | Path | object, out: Path) -> None:
    if hasattr(hf_config, "save_pretrained"):
        hf_config.save_pretrained(str(out))
        return
    path = Path(hf_config)  # type: ignore[arg-type]
    path = path / "config.json" if path.is_dir() else path
    if not path.is_file():
        raise ValueError(f"--hf-config {hf_config}: no config.json there")
    if path.resolve() != (out / "config.json").resolve():
        shutil.copyfile(path, out / "config.json")
