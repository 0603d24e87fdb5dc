"""Image classification: a small GroupNorm CNN and its data sets.

The default data set is scikit-learn's digits (1797 8x8 grey images, 10 classes), which
ships inside scikit-learn, so a vision run needs no download. MNIST / CIFAR-10 work too
when torchvision is installed and the data already sits in a local folder.
GroupNorm instead of BatchNorm: no running statistics, so a model's state is exactly
its parameters and averaging models across learners means something.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

import numpy as np
import torch
from torch import nn

TORCHVISION_DATASETS = ("mnist", "cifar10")


@dataclass(frozen=True)
class ImageData:
    """Train and validation images as float32 [N, C, H, W] in [0, 1] and int64 labels."""

    x_train: np.ndarray
    y_train: np.ndarray
    x_val: np.ndarray
    y_val: np.ndarray
    num_classes: int
    name: str

    @property
    def image_shape(self) -> tuple[int, int, int]:
        return tuple(self.x_train.shape[1:])


@lru_cache(maxsize=4)
def load_digits_data(val_fraction: float = 0.2, seed: int = 0) -> ImageData:
    """sklearn digits, split once, stratified, with a fixed seed (same split on every machine).

    Cached: every learner of an in-process run shares the arrays (nothing writes to them).
    """
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    digits = load_digits()
    x = (digits.images.astype(np.float32) / 16.0)[:, None, :, :]
    y = digits.target.astype(np.int64)
    x_tr, x_va, y_tr, y_va = train_test_split(x, y, test_size=val_fraction, random_state=seed, stratify=y, shuffle=True)
    return ImageData(np.ascontiguousarray(x_tr), y_tr, np.ascontiguousarray(x_va), y_va, num_classes=10, name="digits")


def _parse_torchvision_spec(spec: str) -> tuple[str | None, Path]:
    """ "mnist:/data", "cifar10:/data" or a bare folder (data set guessed from what is in it)."""
    head, sep, tail = spec.partition(":")
    if sep and head.lower() in TORCHVISION_DATASETS:
        return head.lower(), Path(tail).expanduser()
    return None, Path(spec).expanduser()


def load_torchvision_data(spec: str) -> ImageData:
    """MNIST or CIFAR-10 from a local root that already holds it (never downloads).

    `spec` is "mnist:ROOT", "cifar10:ROOT", or just ROOT, in which case MNIST is tried
    first, then CIFAR-10. The official train split trains, the test split validates.
    """
    which, root = _parse_torchvision_spec(spec)
    if not root.exists():
        raise FileNotFoundError(f"vision data root not found: {str(root)!r}")
    try:
        import torchvision  # noqa: F401
        from torchvision import datasets
    except ImportError as e:
        raise ImportError(
            f"loading image data from {str(root)!r} needs torchvision, which is not installed; "
            "install torchvision, or pass no data path to use scikit-learn's built-in digits"
        ) from e

    candidates = [which] if which else list(TORCHVISION_DATASETS)
    errors: list[str] = []
    for name in candidates:
        cls = datasets.MNIST if name == "mnist" else datasets.CIFAR10
        try:
            train = cls(str(root), train=True, download=False)
            val = cls(str(root), train=False, download=False)
        except (RuntimeError, FileNotFoundError, OSError) as e:
            errors.append(f"{name}: {e}")
            continue
        return ImageData(*_to_arrays(train), *_to_arrays(val), num_classes=10, name=name)
    raise FileNotFoundError(
        f"no {' or '.join(candidates)} data set found under {str(root)!r} "
        f"(download=False; put the data there first): {'; '.join(errors)}"
    )


def _to_arrays(ds: object) -> tuple[np.ndarray, np.ndarray]:
    """torchvision MNIST ([N, H, W] uint8 tensor) or CIFAR ([N, H, W, C] uint8 array) -> NCHW float."""
    data = np.asarray(ds.data)  # type: ignore[attr-defined]
    data = data[:, None, :, :] if data.ndim == 3 else data.transpose(0, 3, 1, 2)
    x = np.ascontiguousarray(data.astype(np.float32) / 255.0)
    y = np.asarray(ds.targets, dtype=np.int64)  # type: ignore[attr-defined]
    return x, y


def _groups(channels: int) -> int:
    return max(g for g in (8, 4, 2, 1) if channels % g == 0)


class SmallCNN(nn.Module):
    """conv-GN-GELU x3 (two of them stride 2), global average pool, linear head.

    Input-size agnostic (8x8 digits, 28x28 MNIST, 32x32 CIFAR) thanks to the global pool.
    """

    def __init__(self, in_channels: int = 1, num_classes: int = 10, width: int = 32) -> None:
        super().__init__()
        w1, w2 = width, 2 * width

        def stage(cin: int, cout: int, stride: int) -> list[nn.Module]:
            return [nn.Conv2d(cin, cout, 3, stride=stride, padding=1), nn.GroupNorm(_groups(cout), cout), nn.GELU()]

        self.features = nn.Sequential(*stage(in_channels, w1, 1), *stage(w1, w2, 2), *stage(w2, w2, 2))
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.head = nn.Linear(w2, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.pool(self.features(x)).flatten(1))
