"""The job's checkpoint: parameters and buffers in safetensors, the inner optimizer through the
learner's own format (`learner.state`), the lineage in a JSON manifest. Nothing is pickled.

Each checkpoint is a folder `step-NNNNNNNN/`; the manifest `checkpoint.json`, written atomically
after the folder is complete, names the newest one and is the commit point: a kill -9 at any moment
leaves either the previous checkpoint or the new one, never a torn mix. Older folders are removed
only after the manifest names the new one.

Rank 0 clones the state at a step boundary (cheap) and a background thread writes it, as a learner
saves its optimizer state, so the other ranks do not wait for the disk.
"""

from __future__ import annotations

import json
import logging
import shutil
import threading
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from ..learner.state import load_optimizer, optimizer_state, save_optimizer
from ..records.atomic import atomic_save, atomic_write_json
from .replicated import Lineage

log = logging.getLogger(__name__)
MANIFEST = "checkpoint.json"
MODEL = "model.safetensors"

Snapshot = tuple[dict[str, torch.Tensor], tuple[dict[str, torch.Tensor], dict], dict]


def snapshot(model: torch.nn.Module, optimizer: torch.optim.Optimizer, lineage: Lineage, **extra: object) -> Snapshot:
    """Copies of everything a checkpoint holds, so training may go on while it is written."""
    tensors = {k: v.detach().to("cpu").clone().contiguous() for k, v in model.state_dict().items()}
    return tensors, optimizer_state(optimizer, lineage.step), {**extra, "lineage": lineage.to_json()}


def write(directory: Path, snap: Snapshot) -> Path:
    """Write one checkpoint and commit it in the manifest; returns its folder."""
    tensors, (optim_tensors, optim_meta), meta = snap
    step = int(meta["lineage"]["step"])
    folder = directory / f"step-{step:08d}"
    folder.mkdir(parents=True, exist_ok=True)
    atomic_save(folder / MODEL, lambda tmp: save_file(tensors, str(tmp)))
    save_optimizer(folder, optim_tensors, optim_meta)
    atomic_write_json(directory / MANIFEST, {**meta, "folder": folder.name})
    for old in directory.glob("step-*"):
        if old.is_dir() and old.name != folder.name:
            shutil.rmtree(old, ignore_errors=True)
    return folder


def read_manifest(directory: Path) -> dict | None:
    path = directory / MANIFEST
    if not path.is_file():
        return None
    try:
        return json.loads(path.read_text())
    except (OSError, json.JSONDecodeError):
        return None


def load_params(directory: Path) -> tuple[dict[str, torch.Tensor], dict] | None:
    """(parameters and buffers, manifest) of the newest checkpoint, or None when there is none."""
    manifest = read_manifest(directory)
    if manifest is None:
        return None
    return load_file(str(directory / manifest["folder"] / MODEL)), manifest


def restore(directory: Path, model: torch.nn.Module, optimizer: torch.optim.Optimizer, workers: int) -> Lineage | None:
    """Load the newest checkpoint into `model` and `optimizer`; its lineage, or None without one."""
    found = load_params(directory)
    if found is None:
        return None
    tensors, manifest = found
    model.load_state_dict(tensors)
    if load_optimizer(directory / manifest["folder"], optimizer) is None:
        raise ValueError(f"{directory}: the optimizer state of {manifest['folder']} is unusable")
    return Lineage.from_json(workers, manifest["lineage"])


class Writer:
    """Writes the newest submitted snapshot in a background thread; a pending older one is skipped."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self.directory.mkdir(parents=True, exist_ok=True)
        self._cond = threading.Condition()
        self._pending: Snapshot | None = None
        self._busy = False
        self._closed = False
        self._thread = threading.Thread(target=self._run, name="ddiloco-dp-checkpoint", daemon=True)
        self._thread.start()

    def submit(self, snap: Snapshot) -> None:
        with self._cond:
            self._pending = snap
            self._cond.notify_all()

    def _run(self) -> None:
        while True:
            with self._cond:
                self._cond.wait_for(lambda: self._pending is not None or self._closed)
                if self._pending is None:
                    return
                snap, self._pending, self._busy = self._pending, None, True
            try:
                write(self.directory, snap)
            except OSError as exc:
                log.warning("could not write the checkpoint: %s", exc)
            with self._cond:
                self._busy = False
                self._cond.notify_all()

    def flush(self, timeout: float = 60.0) -> bool:
        """Wait until everything submitted is on disk (bounded); False when it is not."""
        with self._cond:
            return self._cond.wait_for(lambda: self._pending is None and not self._busy, timeout)

    def close(self) -> None:
        self.flush()
        with self._cond:
            self._closed = True
            self._cond.notify_all()
        self._thread.join(timeout=10)
