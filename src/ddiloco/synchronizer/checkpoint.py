"""Synchronizer checkpoints: safetensors per fragment version plus a JSON manifest, written atomically.

Layout of a checkpoint folder (one per synchronizer shard):

    manifest.json                       seq, versions, which file holds each fragment and how many
                                        outer steps its momentum took (the outer-step options count
                                        them: `core.outer`), grace-window
                                        estimates, rejection counts, the ledger (per-learner counters,
                                        data positions, the run's first start, from which --duration
                                        counts), and the run's identity (plan, config)
    fragments/p0003-v00000017.safetensors
                                        fragment 3 at version 17: its parameters under their names
                                        and the outer Nesterov buffers under "outer/<name>"

A merge only changes one fragment, so a checkpoint writes only the fragments that changed since the
last one (a fragment file is immutable once written) and then the manifest. Each file goes through
write-temp, fsync, rename; the manifest rename is the commit point. A process killed at any moment
restarts from the last committed manifest; fragment files it no longer references are deleted later,
and on start every fragment file the manifest does not name is removed: a process killed between a
fragment file and the manifest leaves a file whose name the next run would otherwise take for its own
write. Loading checks everything it reads (structure, tensors, finiteness) and says what is wrong
(`CheckpointError`) instead of raising from deep inside.
Saving is split in two so that the slow part runs without the service's lock: `snapshot` copies the
new fragment versions out of the core (under the lock), `write` puts them on disk (see `commit`).
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file

from ..core import SynchronizerCore
from ..core.sync_state import OUTER_PREFIX
from ..records.atomic import atomic_save, atomic_write_json, read_json

FORMAT = 1


class CheckpointError(ValueError):
    """A checkpoint or --init file that cannot be used; the message names the file and the problem."""


def read_manifest(path: Path) -> dict:
    """The manifest, checked for the structure `load` relies on."""
    try:
        manifest = read_json(path)
    except (OSError, UnicodeDecodeError, ValueError, RecursionError) as exc:
        raise CheckpointError(f"{path}: not a readable JSON manifest ({str(exc)[:200]})") from None
    if not isinstance(manifest, dict):
        raise CheckpointError(f"{path}: the manifest must be a JSON object, got {type(manifest).__name__}")
    if manifest.get("format") != FORMAT:
        raise CheckpointError(f"{path}: unknown checkpoint format {str(manifest.get('format'))[:40]}")
    frags = manifest.get("fragments")
    if not isinstance(frags, dict):
        raise CheckpointError(f"{path}: the manifest lacks its 'fragments' table")
    for p, entry in frags.items():
        ok = (
            p.isdigit()
            and isinstance(entry, dict)
            and isinstance(entry.get("version"), int)
            and not isinstance(entry.get("version"), bool)
            and 0 <= entry["version"] < 2**53
            and isinstance(entry.get("file"), str)
            and entry["file"].endswith(".safetensors")
            and "/" not in entry["file"]
            and not entry["file"].startswith(".")
            and _outer_steps_ok(entry)
        )
        if not ok:
            raise CheckpointError(f"{path}: bad entry for fragment {p[:20]!r}: {json.dumps(entry)[:120]}")
    for key in ("grace", "rejections", "ledger", "identity"):
        if not isinstance(manifest.get(key, {}), dict):
            raise CheckpointError(f"{path}: {key!r} must be a JSON object")
    if not isinstance(manifest.get("seq", 0), int):
        raise CheckpointError(f"{path}: 'seq' must be an integer")
    return manifest


def _outer_steps_ok(entry: dict) -> bool:
    """A fragment's count of momentum steps, where the manifest has one: 0 up to its version (every
    merge makes a version; a merge of the final flush takes no momentum)."""
    steps = entry.get("outer_steps", 0)
    return isinstance(steps, int) and not isinstance(steps, bool) and 0 <= steps <= entry["version"]


def load_tensors(path: Path, what: str = "checkpoint file") -> dict[str, torch.Tensor]:
    """A safetensors file, every value finite; CheckpointError naming the file otherwise."""
    try:
        tensors = load_file(str(path))
    except FileNotFoundError:
        raise CheckpointError(f"{path}: {what} is missing") from None
    except (SafetensorError, OSError, ValueError, RuntimeError) as exc:
        raise CheckpointError(f"{path}: not a readable safetensors {what} ({str(exc)[:200]})") from None
    for name, t in tensors.items():
        if t.is_floating_point() and not bool(torch.isfinite(t).all()):
            raise CheckpointError(f"{path}: tensor {name!r} holds NaN or Inf values")
    return tensors


@dataclass
class Snapshot:
    """Everything one checkpoint writes, taken out of the core so it can be written without its lock
    (copies, or the live tensors under write-ahead: see `CheckpointStore.snapshot`)."""

    seq: int
    versions: dict[int, int]
    files: dict[int, str]
    tensors: dict[int, dict[str, torch.Tensor]]  # only the fragment files not on disk yet
    manifest: dict
    write_seconds: float = 0.0


class CheckpointStore:
    def __init__(self, directory: str | Path, keep_versions: int = 2) -> None:
        self.dir = Path(directory)
        self.frag_dir = self.dir / "fragments"
        self.frag_dir.mkdir(parents=True, exist_ok=True)
        self.keep_versions = max(1, keep_versions)
        self.seq = 0
        self._on_disk = self._remove_orphans()

    def _remove_orphans(self) -> set[str]:
        """Fragment files the committed manifest names; every other one (a killed writer's) is removed."""
        named = set()
        if self.exists():
            named = {e["file"] for e in read_manifest(self.manifest_path)["fragments"].values()}
        for path in self.frag_dir.iterdir():
            if path.name not in named and path.is_file():
                path.unlink(missing_ok=True)
        return named

    @property
    def manifest_path(self) -> Path:
        return self.dir / "manifest.json"

    def exists(self) -> bool:
        return self.manifest_path.is_file()

    @staticmethod
    def fragment_file(p: int, version: int) -> str:
        return f"p{p:04d}-v{version:08d}.safetensors"

    def snapshot(self, core: SynchronizerCore, identity: dict, ledger: dict, copy: bool = True) -> Snapshot:
        """What the next checkpoint needs: only fragments whose current version is not on disk.

        `copy=False` shares the live tensors instead of copying them, for a caller that knows they
        cannot change before the write ends: under write-ahead (`commit`) no learner holds a version
        before it is on disk, so no fragment can merge past a version that is still being written."""
        self.seq += 1
        files, tensors = {}, {}
        for p in core.owned:
            name = self.fragment_file(p, core.versions[p])
            files[p] = name
            if name not in self._on_disk:
                tensors[p] = core.fragment_state(p, copy)
        manifest = {
            "format": FORMAT,
            "seq": self.seq,
            "identity": identity,
            "fragments": {
                str(p): {"version": core.versions[p], "file": files[p], "outer_steps": core.outer[p].steps}
                for p in core.owned
            },
            "grace": core.grace.state_dict(),
            "rejections": dict(core.rejections),
            "ledger": ledger,
        }
        return Snapshot(self.seq, dict(core.versions), files, tensors, manifest)

    def write(self, snap: Snapshot) -> None:
        """Fragment files first (each atomic), then the manifest: its rename is the commit point."""
        for p, values in snap.tensors.items():
            name = snap.files[p]
            tensors = {n: t.contiguous() for n, t in values.items()}
            metadata = {"fragment": str(p), "version": str(snap.versions[p])}
            atomic_save(
                self.frag_dir / name,
                lambda tmp, tensors=tensors, metadata=metadata: save_file(tensors, str(tmp), metadata),  # type: ignore[misc]  # mypy cannot type a lambda with defaults (python/mypy#15459)
            )
            self._on_disk.add(name)
        atomic_write_json(self.manifest_path, snap.manifest)
        self._collect_garbage(snap.versions)

    def save(self, core: SynchronizerCore, identity: dict, ledger: dict, copy: bool = True) -> int:
        """Snapshot and write at once (`copy=False`: nothing changes the core meanwhile, see `snapshot`)."""
        snap = self.snapshot(core, identity, ledger, copy)
        self.write(snap)
        return snap.seq

    def _collect_garbage(self, versions: dict[int, int]) -> None:
        for path in list(self.frag_dir.iterdir()):
            if path.name.startswith("."):
                if ".tmp-" in path.name and not path.name.endswith(f"-{os.getpid()}"):
                    path.unlink(missing_ok=True)  # a torn write of a killed process
                continue
            try:
                p, version = int(path.name[1:5]), int(path.name[7:15])
            except ValueError:
                continue
            if p in versions and version <= versions[p] - self.keep_versions:
                path.unlink(missing_ok=True)
                self._on_disk.discard(path.name)

    def load(self, core: SynchronizerCore, identity: dict | None = None) -> dict:
        """Restore `core` from the last committed manifest; returns the manifest (with the ledger)."""
        manifest = read_manifest(self.manifest_path)
        if identity is not None:
            saved = manifest.get("identity", {})
            for key, value in identity.items():
                if key in saved and saved[key] != value:
                    raise CheckpointError(
                        f"{self.manifest_path} belongs to a different run: {key} is {saved[key]!r}, "
                        f"this synchronizer has {value!r}; use another --checkpoint-dir or --fresh"
                    )
        frags = manifest["fragments"]
        missing = [p for p in core.owned if str(p) not in frags]
        if missing:
            raise CheckpointError(f"{self.manifest_path} lacks fragments {missing} of this shard")
        params: dict[str, torch.Tensor] = {}
        outer: dict[int, dict[str, torch.Tensor]] = {}
        versions: dict[int, int] = {}
        outer_steps: dict[int, int] = {}  # a manifest written before the count was kept: the core guesses
        for p in core.owned:
            entry = frags[str(p)]
            tensors = load_tensors(self.frag_dir / entry["file"])
            outer[p] = {n[len(OUTER_PREFIX) :]: t for n, t in tensors.items() if n.startswith(OUTER_PREFIX)}
            for n in core.plan.names[p]:
                if n not in tensors:
                    raise CheckpointError(f"{self.frag_dir / entry['file']} lacks tensor {n!r}")
                if tuple(tensors[n].shape) != tuple(core.params[n].shape):
                    raise CheckpointError(
                        f"{self.frag_dir / entry['file']}: tensor {n!r} has shape "
                        f"{tuple(tensors[n].shape)}, the model has {tuple(core.params[n].shape)}"
                    )
                params[n] = tensors[n]
            versions[p] = int(entry["version"])
            if "outer_steps" in entry:
                outer_steps[p] = entry["outer_steps"]
        core.load_state_dict(
            {
                "params": params,
                "versions": versions,
                "outer": outer,
                "outer_steps": outer_steps,
                "grace": manifest.get("grace", {}),
                "rejections": manifest.get("rejections", {}),
            }
        )
        self.seq = int(manifest.get("seq", 0))
        return manifest


def load_global_params(directories: Iterable[str | Path]) -> tuple[dict[str, torch.Tensor], dict[int, int]]:
    """Global parameters and versions from the manifests of every shard (for evaluation, no core)."""
    params: dict[str, torch.Tensor] = {}
    versions: dict[int, int] = {}
    for directory in directories:
        directory = Path(directory)
        manifest = read_manifest(directory / "manifest.json")
        for p, entry in manifest["fragments"].items():
            tensors = load_tensors(directory / "fragments" / entry["file"])
            params.update({n: t for n, t in tensors.items() if not n.startswith(OUTER_PREFIX)})
            versions[int(p)] = int(entry["version"])
    return params, versions
