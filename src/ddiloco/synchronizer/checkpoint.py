"""Synchronizer checkpoints: safetensors per fragment version plus a JSON manifest, written atomically.

Layout of a checkpoint folder (one per synchronizer shard):

    manifest.json                       seq, versions, which file holds each fragment, grace-window
                                        estimates, rejection counts, the ledger (per-learner counters
                                        and data positions), and the run's identity (plan, config)
    fragments/p0003-v00000017.safetensors
                                        fragment 3 at version 17: its parameters under their names
                                        and the outer Nesterov buffers under "outer/<name>"

A merge only changes one fragment, so a checkpoint writes only the fragments that changed since the
last one (a fragment file is immutable once written) and then the manifest. Each file goes through
write-temp, fsync, rename; the manifest rename is the commit point. A process killed at any moment
restarts from the last committed manifest; fragment files it no longer references are deleted later.
Saving is split in two so that the slow part runs without the service's lock: `snapshot` copies the
new fragment versions out of the core (under the lock), `write` puts them on disk (see `commit`).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable

import torch
from safetensors.torch import load_file, save

from ..core import SynchronizerCore
from ..core.synchronizer import OUTER_PREFIX
from ..records.atomic import atomic_write, atomic_write_json, read_json

FORMAT = 1


@dataclass
class Snapshot:
    """Everything one checkpoint writes, copied out of the core so it can be written without its lock."""

    seq: int
    versions: dict[int, int]
    files: dict[int, str]
    tensors: dict[int, dict[str, torch.Tensor]]  # only the fragment files not on disk yet
    manifest: dict


class CheckpointStore:
    def __init__(self, directory: str | Path, keep_versions: int = 2) -> None:
        self.dir = Path(directory)
        self.frag_dir = self.dir / "fragments"
        self.frag_dir.mkdir(parents=True, exist_ok=True)
        self.keep_versions = max(1, keep_versions)
        self.seq = 0
        self._on_disk = {p.name for p in self.frag_dir.iterdir() if not p.name.startswith(".")}

    @property
    def manifest_path(self) -> Path:
        return self.dir / "manifest.json"

    def exists(self) -> bool:
        return self.manifest_path.is_file()

    @staticmethod
    def fragment_file(p: int, version: int) -> str:
        return f"p{p:04d}-v{version:08d}.safetensors"

    def snapshot(self, core: SynchronizerCore, identity: dict, ledger: dict) -> Snapshot:
        """Copy what the next checkpoint needs (cheap: only fragments whose current version is not on disk)."""
        self.seq += 1
        files, tensors = {}, {}
        for p in core.owned:
            name = self.fragment_file(p, core.versions[p])
            files[p] = name
            if name not in self._on_disk:
                tensors[p] = core.fragment_state(p)
        manifest = {
            "format": FORMAT,
            "seq": self.seq,
            "identity": identity,
            "fragments": {str(p): {"version": core.versions[p], "file": files[p]} for p in core.owned},
            "grace": core.grace.state_dict(),
            "rejections": dict(core.rejections),
            "ledger": ledger,
        }
        return Snapshot(self.seq, dict(core.versions), files, tensors, manifest)

    def write(self, snap: Snapshot) -> None:
        """Fragment files first (each atomic), then the manifest: its rename is the commit point."""
        for p, values in snap.tensors.items():
            name = snap.files[p]
            data = save({n: t.contiguous() for n, t in values.items()},
                        metadata={"fragment": str(p), "version": str(snap.versions[p])})
            atomic_write(self.frag_dir / name, data)
            self._on_disk.add(name)
        atomic_write_json(self.manifest_path, snap.manifest)
        self._collect_garbage(snap.versions)

    def save(self, core: SynchronizerCore, identity: dict, ledger: dict) -> int:
        snap = self.snapshot(core, identity, ledger)
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
        manifest = read_json(self.manifest_path)
        if manifest.get("format") != FORMAT:
            raise ValueError(f"{self.manifest_path}: unknown checkpoint format {manifest.get('format')}")
        if identity is not None:
            saved = manifest.get("identity", {})
            for key, value in identity.items():
                if key in saved and saved[key] != value:
                    raise ValueError(
                        f"{self.manifest_path} belongs to a different run: {key} is {saved[key]!r}, "
                        f"this synchronizer has {value!r}; use another --checkpoint-dir or --fresh"
                    )
        frags = manifest["fragments"]
        missing = [p for p in core.owned if str(p) not in frags]
        if missing:
            raise ValueError(f"{self.manifest_path} lacks fragments {missing} of this shard")
        params: dict[str, torch.Tensor] = {}
        outer: dict[int, dict[str, torch.Tensor]] = {}
        versions: dict[int, int] = {}
        for p in core.owned:
            entry = frags[str(p)]
            tensors = load_file(str(self.frag_dir / entry["file"]))
            outer[p] = {n[len(OUTER_PREFIX):]: t for n, t in tensors.items() if n.startswith(OUTER_PREFIX)}
            for n in core.plan.names[p]:
                if n not in tensors:
                    raise ValueError(f"{entry['file']} lacks tensor {n!r}")
                params[n] = tensors[n]
            versions[p] = int(entry["version"])
        core.load_state_dict({
            "params": params,
            "versions": versions,
            "outer": outer,
            "grace": manifest.get("grace", {}),
            "rejections": manifest.get("rejections", {}),
        })
        self.seq = int(manifest.get("seq", 0))
        return manifest


def load_global_params(directories: Iterable[str | Path]) -> tuple[dict[str, torch.Tensor], dict[int, int]]:
    """Global parameters and versions from the manifests of every shard (for evaluation, no core)."""
    params: dict[str, torch.Tensor] = {}
    versions: dict[int, int] = {}
    for directory in directories:
        directory = Path(directory)
        manifest = read_json(directory / "manifest.json")
        for p, entry in manifest["fragments"].items():
            tensors = load_file(str(directory / "fragments" / entry["file"]))
            params.update({n: t for n, t in tensors.items() if not n.startswith(OUTER_PREFIX)})
            versions[int(p)] = int(entry["version"])
    return params, versions
