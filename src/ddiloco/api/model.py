"""What the synchronizer needs to know of a model: its parameters (tied weights once), which of them
are embeddings (merged by plain averaging), and how many fragments it can be cut into."""

from __future__ import annotations

import difflib
import logging
from collections.abc import Iterable, Mapping
from pathlib import Path

import torch

from ..core.config import AlgorithmConfig
from ..core.fragments import plan_for_model

log = logging.getLogger(__name__)
PLAIN_NAMES_KEY = "ddiloco.plain_names"  # safetensors metadata written by `save_initial`


def parameters(model: torch.nn.Module | Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """name -> tensor, each tied weight once under its first name (what `named_parameters()` gives)."""
    if isinstance(model, torch.nn.Module):
        return {n: p.detach() for n, p in model.named_parameters()}
    return {n: t.detach() for n, t in model.items()}


def embedding_names(model: torch.nn.Module) -> frozenset[str]:
    """Every nn.Embedding's weight, and every parameter tied to one, under its `named_parameters` name."""
    embedding_weights = {
        id(m.weight) for m in model.modules() if isinstance(m, (torch.nn.Embedding, torch.nn.EmbeddingBag))
    }
    return frozenset(n for n, p in model.named_parameters() if id(p) in embedding_weights)


def check_plain_names(names: Iterable[str], params: Mapping[str, torch.Tensor]) -> frozenset[str]:
    """The names, each one a parameter of the model; a typo is an error that suggests the real name."""
    out = frozenset(n for n in names if n)
    for name in sorted(out - set(params)):
        close = difflib.get_close_matches(name, list(params), n=3)
        hint = f"; did you mean {', '.join(close)}?" if close else ""
        raise ValueError(f"plain name {name!r} is not a parameter of the model{hint}")
    return out


def fit_fragments(num_tensors: int, requested: int | None, sync_every: int | None = None) -> int:
    """P as asked, or by default min(24, number of tensors, H), with a note when it is lowered."""
    if requested is not None:
        if requested > num_tensors:
            raise ValueError(
                f"cannot split {num_tensors} tensors into {requested} fragments: use fragments <= {num_tensors}"
            )
        return requested
    default = AlgorithmConfig().fragments
    fitted = min(default, num_tensors, sync_every or default)
    if fitted < default:
        why = (
            f"the model has {num_tensors} parameter tensors"
            if fitted == num_tensors
            else f"H = {sync_every} steps between syncs"
        )
        log.warning("%d fragments instead of the default %d: %s", fitted, default, why)
    return fitted


def balance_note(params: Mapping[str, torch.Tensor], fragments: int) -> str | None:
    """A warning, with a P that balances better, when the largest fragment is over twice the smallest
    (whole tensors are never split)."""

    def spread(p: int) -> tuple[int, int]:
        sizes = plan_for_model(params, p).sizes
        return min(sizes), max(sizes)

    small, large = spread(fragments)
    if small > 0 and large <= 2 * small:
        return None
    better = next((p for p in range(fragments - 1, 0, -1) if (lambda s: s[0] > 0 and s[1] <= 2 * s[0])(spread(p))), 1)
    return (
        f"{fragments} fragments range from {small:,} to {large:,} parameters (whole tensors are not split); "
        f"{better} fragments would keep them within 2x of each other"
    )


def save_initial(model: torch.nn.Module, path: str | Path) -> Path:
    """The model's parameters as the synchronizer's `--init` file: tied weights once, the embeddings
    named in the file's metadata (so `--plain-names` is not needed)."""
    from safetensors.torch import save_file

    path = Path(path)
    tensors = {n: t.contiguous().clone() for n, t in parameters(model).items()}
    save_file(tensors, str(path), metadata={PLAIN_NAMES_KEY: ",".join(sorted(embedding_names(model)))})
    return path


def load_initial(path: str | Path, lazy: bool = False) -> tuple[Mapping[str, torch.Tensor], frozenset[str] | None]:
    """Parameters (and plain names, when recorded) from a safetensors file or a Hugging Face model folder.
    `lazy`: a safetensors file comes as a `TensorFile`, each tensor read when looked up (a shard reads
    only its own; its `shapes` serve the rest)."""
    path = Path(path)
    if path.is_dir():
        return _load_hf_folder(path)
    from ..synchronizer.initial import TensorFile

    file = TensorFile(path)
    recorded = file.metadata.get(PLAIN_NAMES_KEY)
    tensors = file if lazy else dict(file.items())
    return tensors, (frozenset(n for n in recorded.split(",") if n) if recorded is not None else None)


def _load_hf_folder(path: Path) -> tuple[dict[str, torch.Tensor], frozenset[str]]:
    if not (path / "config.json").is_file():
        raise ValueError(f"{path} is a folder but not a Hugging Face model folder (no config.json)")
    try:
        from transformers import AutoConfig, AutoModel, AutoModelForCausalLM
    except ImportError:
        raise ValueError(
            "--init of a Hugging Face model folder needs transformers: pip install 'ddiloco[hf]'"
        ) from None
    config = AutoConfig.from_pretrained(str(path), local_files_only=True)
    cls = (
        AutoModelForCausalLM
        if getattr(config, "architectures", None)
        and any(a.endswith("ForCausalLM") or a.endswith("LMHeadModel") for a in config.architectures)
        else AutoModel
    )
    model = cls.from_pretrained(str(path), local_files_only=True)
    return parameters(model), embedding_names(model)
