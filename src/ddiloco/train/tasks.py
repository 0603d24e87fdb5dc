"""Tasks: what the training drivers train -- a model, its sharded data, its loss and its eval.

A driver only ever talks to a `Task` (from `make_task`), so the same driver code runs the
dense GPT, the MoE GPT and the vision model.
"""

from __future__ import annotations

import contextlib
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn
from torch.nn import functional as F

from .corpus import EncodedCorpus, encoded_corpus
from .gpt import EMBEDDING_NAMES, GPT, GPTConfig
from .streams import Batch, BatchStream, ImageStream, TokenWindowStream, check_shard_layout
from .vision import ImageData, SmallCNN, load_digits_data, load_torchvision_data

__all__ = [
    "Batch",
    "BatchStream",
    "Task",
    "LanguageModelTask",
    "VisionTask",
    "make_task",
    "count_parameters",
    "MODELS",
    "MODEL_SIZES",
]

MODELS = ("gpt", "gpt-moe", "vision")
MODEL_SIZES = ("tiny", "default", "2m", "10m", "50m")

#: Width/depth presets of the language models (seq_len and vocab come from make_task).
#: "default" dense is ~0.88M parameters with the byte vocab; its MoE twin has 4 experts,
#: top-2, each half as wide as the dense MLP (same active compute), ~1.4M parameters.
#: "2m", "10m" and "50m" are named by their dense parameter count (byte vocab, seq_len 128), for
#: the scaling sweep and the overhead benchmark; the vision model has only "tiny" and "default".
LM_PRESETS: dict[str, dict[str, Any]] = {
    "tiny": dict(d_model=32, n_layers=2, n_heads=2, mlp_ratio=4.0),
    "default": dict(d_model=128, n_layers=4, n_heads=4, mlp_ratio=4.0),
    "2m": dict(d_model=192, n_layers=4, n_heads=4, mlp_ratio=4.0),
    "10m": dict(d_model=384, n_layers=6, n_heads=6, mlp_ratio=4.0),
    "50m": dict(d_model=640, n_layers=10, n_heads=10, mlp_ratio=4.0),
}
MOE_PRESET: dict[str, Any] = dict(num_experts=4, top_k=2, expert_mlp_ratio=2.0, aux_loss_coef=0.01)
VISION_WIDTHS = {"tiny": 16, "default": 32}


def count_parameters(model: nn.Module, trainable_only: bool = False) -> int:
    """Number of scalar parameters (all of them, or only those with requires_grad)."""
    return sum(p.numel() for p in model.parameters() if p.requires_grad or not trainable_only)


def _device_of(model: nn.Module) -> torch.device:
    p = next(model.parameters(), None)
    return p.device if p is not None else torch.device("cpu")


@contextlib.contextmanager
def _evaluating(model: nn.Module) -> Iterator[None]:
    """eval() + no_grad() for the block, then every submodule's train/eval flag as it was."""
    flags = [(m, m.training) for m in model.modules()]
    model.eval()
    try:
        with torch.no_grad():
            yield
    finally:
        for m, was_training in flags:
            m.training = was_training


def _seeded_build(seed: int, build: Callable[[], nn.Module]) -> nn.Module:
    """Build under torch.manual_seed(seed) without disturbing the caller's global RNG."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return build()


class Task(ABC):
    """A model family plus its data, loss and evaluation."""

    name: str
    #: Parameter names the synchronizer averages plainly (embeddings); empty for vision.
    embedding_names: frozenset[str]

    @abstractmethod
    def build_model(self, seed: int) -> nn.Module:
        """A freshly initialised model; same seed -> identical parameters."""

    @abstractmethod
    def stream(self, shard: int, num_shards: int, batch_size: int, seed: int) -> BatchStream:
        """The training batches of shard `shard` of `num_shards`."""

    @abstractmethod
    def loss(self, model: nn.Module, batch: Batch) -> torch.Tensor:
        """Scalar training loss (for the MoE: cross-entropy + aux_loss_coef * aux)."""

    @abstractmethod
    def evaluate(self, model: nn.Module, max_batches: int | None = None, batch_size: int = 32) -> dict[str, float]:
        """Metrics on the fixed validation set, in eval mode; the train/eval mode is restored."""

    def describe(self) -> dict:
        """JSON-serialisable summary for run logs."""
        return {"task": self.name}


class LanguageModelTask(Task):
    """Next-token prediction with a GPT (dense or MoE) on a tokenized corpus."""

    embedding_names = EMBEDDING_NAMES

    def __init__(self, name: str, config: GPTConfig, corpus: EncodedCorpus, shard_layout: str = "interleaved") -> None:
        """`shard_layout`: how the training text is dealt to the learners (`streams.TokenWindowStream`)."""
        check_shard_layout(shard_layout)
        self.name = name
        self.config = config
        self.corpus = corpus
        self.shard_layout = shard_layout
        self.tokenizer = corpus.tokenizer
        self.seq_len = config.seq_len
        n_val = (len(corpus.val) - 1) // self.seq_len
        if n_val < 1:
            raise ValueError(
                f"the validation split of {corpus.source} has {len(corpus.val)} tokens, "
                f"fewer than seq_len + 1 = {self.seq_len + 1}; use more text or a larger val_fraction"
            )
        # Fixed validation set: consecutive, non-overlapping windows from the start of the split.
        val = corpus.val
        self._val_x = torch.from_numpy(val[: n_val * self.seq_len].astype(np.int64).reshape(n_val, self.seq_len))
        self._val_y = torch.from_numpy(val[1 : n_val * self.seq_len + 1].astype(np.int64).reshape(n_val, self.seq_len))

    def build_model(self, seed: int) -> nn.Module:
        return _seeded_build(seed, lambda: GPT(self.config))

    def stream(self, shard: int, num_shards: int, batch_size: int, seed: int) -> BatchStream:
        return TokenWindowStream(
            self.corpus.train, self.seq_len, shard, num_shards, batch_size, seed, self.shard_layout
        )

    def _cross_entropy(self, logits: torch.Tensor, targets: torch.Tensor, reduction: str = "mean") -> torch.Tensor:
        return F.cross_entropy(logits.reshape(-1, logits.size(-1)), targets.reshape(-1), reduction=reduction)

    def loss(self, model: nn.Module, batch: Batch) -> torch.Tensor:
        device = _device_of(model)
        logits, aux = model(batch.inputs.to(device, non_blocking=True), return_aux=True)
        loss = self._cross_entropy(logits, batch.targets.to(device, non_blocking=True))
        if self.config.is_moe:
            loss = loss + self.config.aux_loss_coef * aux
        return loss

    def evaluate(self, model: nn.Module, max_batches: int | None = None, batch_size: int = 32) -> dict[str, float]:
        """{"eval_loss": mean next-token cross-entropy (nats/token, no aux loss)}."""
        device = _device_of(model)
        total, count = 0.0, 0
        with _evaluating(model):
            for b, start in enumerate(range(0, len(self._val_x), batch_size)):
                if max_batches is not None and b >= max_batches:
                    break
                x = self._val_x[start : start + batch_size].to(device)
                y = self._val_y[start : start + batch_size].to(device)
                total += float(self._cross_entropy(model(x), y, reduction="sum"))
                count += y.numel()
        return {"eval_loss": total / max(count, 1)}

    def describe(self) -> dict:
        return {
            "task": self.name,
            "data": self.corpus.source,
            "tokenizer": self.tokenizer.name,
            "vocab_size": self.tokenizer.vocab_size,
            "train_tokens": int(len(self.corpus.train)),
            "val_tokens": int(len(self.corpus.val)),
            "model": self.config.to_dict(),
        }


class VisionTask(Task):
    """Image classification with `SmallCNN`."""

    name = "vision"
    embedding_names: frozenset[str] = frozenset()

    def __init__(self, data: ImageData, width: int = 32) -> None:
        self.data = data
        self.width = width
        self._val_x = torch.from_numpy(data.x_val)
        self._val_y = torch.from_numpy(data.y_val)

    def build_model(self, seed: int) -> nn.Module:
        in_channels = self.data.image_shape[0]
        return _seeded_build(seed, lambda: SmallCNN(in_channels, self.data.num_classes, self.width))

    def stream(self, shard: int, num_shards: int, batch_size: int, seed: int) -> BatchStream:
        return ImageStream(self.data.x_train, self.data.y_train, shard, num_shards, batch_size, seed)

    def loss(self, model: nn.Module, batch: Batch) -> torch.Tensor:
        device = _device_of(model)
        logits = model(batch.inputs.to(device, non_blocking=True))
        return F.cross_entropy(logits, batch.targets.to(device, non_blocking=True))

    def evaluate(self, model: nn.Module, max_batches: int | None = None, batch_size: int = 32) -> dict[str, float]:
        """{"eval_loss": mean cross-entropy, "eval_accuracy": fraction correct} on the validation images."""
        device = _device_of(model)
        total, correct, count = 0.0, 0, 0
        with _evaluating(model):
            for b, start in enumerate(range(0, len(self._val_x), batch_size)):
                if max_batches is not None and b >= max_batches:
                    break
                x = self._val_x[start : start + batch_size].to(device)
                y = self._val_y[start : start + batch_size].to(device)
                logits = model(x)
                total += float(F.cross_entropy(logits, y, reduction="sum"))
                correct += int((logits.argmax(dim=-1) == y).sum())
                count += y.numel()
        return {"eval_loss": total / max(count, 1), "eval_accuracy": correct / max(count, 1)}

    def describe(self) -> dict:
        return {
            "task": self.name,
            "data": self.data.name,
            "train_images": int(len(self.data.x_train)),
            "val_images": int(len(self.data.x_val)),
            "image_shape": list(self.data.image_shape),
            "width": self.width,
        }


def gpt_config(model: str, model_size: str = "default", *, vocab_size: int = 256, seq_len: int = 128) -> GPTConfig:
    """The GPTConfig `make_task` uses for "gpt"/"gpt-moe" at a given size."""
    if model_size not in LM_PRESETS:
        raise ValueError(f"unknown model_size {model_size!r}; choose one of {', '.join(MODEL_SIZES)}")
    extra = MOE_PRESET if model == "gpt-moe" else {}
    return GPTConfig(vocab_size=vocab_size, seq_len=seq_len, **LM_PRESETS[model_size], **extra)


def make_task(
    model: str,
    data: str | None = None,
    *,
    seq_len: int = 128,
    tokenizer: str = "byte",
    bpe_vocab_size: int = 1024,
    model_size: str = "default",
    val_fraction: float = 0.1,
    shard_layout: str = "interleaved",
) -> Task:
    """The task for `model` in {"gpt", "gpt-moe", "vision"}.

    LM: `data` is a text file or folder (None: the Python stdlib sources), the last
    `val_fraction` of it validates; `shard_layout` deals its training part to the learners
    (`streams.TokenWindowStream`). Vision: `data` None means scikit-learn digits (fixed
    80/20 split; `val_fraction` is not used), otherwise a local torchvision root, written
    "mnist:ROOT", "cifar10:ROOT" or just ROOT. `model_size` "tiny" is for fast tests;
    `seq_len` is used as given for every size.
    """
    if model not in MODELS:
        raise ValueError(f"unknown model {model!r}; choose one of {', '.join(MODELS)}")
    if model_size not in MODEL_SIZES:
        raise ValueError(f"unknown model_size {model_size!r}; choose one of {', '.join(MODEL_SIZES)}")
    if model == "vision":
        if model_size not in VISION_WIDTHS:
            raise ValueError(f"the vision model comes in sizes {', '.join(VISION_WIDTHS)}, not {model_size!r}")
        images = load_digits_data() if data is None else load_torchvision_data(str(data))
        return VisionTask(images, width=VISION_WIDTHS[model_size])
    if seq_len < 1:
        raise ValueError(f"seq_len must be >= 1, got {seq_len}")
    corpus = encoded_corpus(None if data is None else Path(data), tokenizer, bpe_vocab_size, val_fraction)
    config = gpt_config(model, model_size, vocab_size=corpus.tokenizer.vocab_size, seq_len=seq_len)
    return LanguageModelTask(model, config, corpus, shard_layout)
