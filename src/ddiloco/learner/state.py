"""A learner's own checkpoint: its inner optimizer state and step count, so a restarted learner
resumes with warm AdamW moments and the right warm-up position instead of from scratch.

(The paper copies the inner state of a healthy peer instead; ours needs no peer.) The model weights
are not saved: a restarted learner always starts from the global parameters. Tensors go to
safetensors, the rest to JSON; the training thread only clones the state, a background thread
writes it atomically (temp, fsync, rename).
"""

from __future__ import annotations

import json
import logging
import threading
from pathlib import Path

import torch
from safetensors.torch import load_file, save

from ..records.atomic import atomic_write, atomic_write_json
from ..records.supervise import Supervisor

log = logging.getLogger(__name__)
TENSORS = "inner.safetensors"
META = "inner.json"


def optimizer_state(optimizer: torch.optim.Optimizer, inner_steps: int) -> tuple[dict[str, torch.Tensor], dict]:
    """(tensors, meta) of an optimizer's state_dict, cloned so the caller may keep training."""
    sd = optimizer.state_dict()
    tensors, scalars = {}, {}
    for index, state in sd["state"].items():
        for key, value in state.items():
            if isinstance(value, torch.Tensor):
                tensors[f"{index}/{key}"] = value.detach().to("cpu").clone().contiguous()
            else:
                scalars[f"{index}/{key}"] = value
    return tensors, {"param_groups": sd["param_groups"], "scalars": scalars, "inner_steps": inner_steps}


def save_optimizer(directory: str | Path, tensors: dict[str, torch.Tensor], meta: dict) -> None:
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    atomic_write(directory / TENSORS, save(tensors))
    atomic_write_json(directory / META, meta)


def load_optimizer(directory: str | Path, optimizer: torch.optim.Optimizer) -> int | None:
    """Restore the optimizer; returns the saved inner step count, or None if nothing usable is there."""
    directory = Path(directory)
    if not (directory / META).is_file() or not (directory / TENSORS).is_file():
        return None
    try:
        meta = json.loads((directory / META).read_text())
        tensors = load_file(str(directory / TENSORS))
        state: dict[int, dict] = {}
        for key, value in tensors.items():
            index, name = key.split("/", 1)
            state.setdefault(int(index), {})[name] = value
        for key, value in meta.get("scalars", {}).items():
            index, name = key.split("/", 1)
            state.setdefault(int(index), {})[name] = value
        groups = [dict(g, betas=tuple(g["betas"])) if "betas" in g else g for g in meta["param_groups"]]
        optimizer.load_state_dict({"state": state, "param_groups": groups})
    except Exception as exc:  # noqa: BLE001 - any unusable file (torn, foreign, corrupt) means "start fresh"
        log.warning("ignoring unusable learner state in %s: %s", directory, exc)
        return None
    return int(meta.get("inner_steps", 0))


class BackgroundSaver:
    """Writes the latest handed-over state in a background thread; older pending states are skipped."""

    def __init__(self, directory: str | Path) -> None:
        self.directory = Path(directory)
        self._cond = threading.Condition()
        self._pending: tuple[dict, dict] | None = None
        self._closed = False
        self._supervisor = Supervisor("learner state writer (the next state is written anew)", log)
        self._thread = threading.Thread(target=self._run, name="ddiloco-learner-state", daemon=True)
        self._thread.start()

    def submit(self, optimizer: torch.optim.Optimizer, inner_steps: int) -> None:
        state = optimizer_state(optimizer, inner_steps)
        with self._cond:
            self._pending = state
            self._cond.notify()

    def _run(self) -> None:
        while True:
            with self._cond:
                self._cond.wait_for(lambda: self._pending is not None or self._closed)
                if self._pending is None:
                    return
                tensors, meta = self._pending
                self._pending = None
            try:
                save_optimizer(self.directory, tensors, meta)
                self._supervisor.succeeded()
            except Exception as exc:  # any error (safetensors raises its own): logged, the thread lives on
                self._supervisor.failed(exc)  # its traceback once per distinct error; the next state retries

    def close(self) -> None:
        with self._cond:
            self._closed = True
            self._cond.notify()
        self._thread.join(timeout=10)
