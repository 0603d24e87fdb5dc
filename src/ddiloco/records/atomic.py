"""Atomic file writes: write a temporary file, fsync it, rename it over the target, fsync the folder.

A reader (or a process restarted after kill -9 or a power cut) sees either the old file or the new
one, never a torn mix.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path


def atomic_write(path: str | Path, data: bytes, durable: bool = True) -> None:
    def write(tmp: Path) -> None:
        with open(tmp, "wb") as f:
            f.write(data)

    atomic_save(path, write, durable)


def atomic_save(path: str | Path, write: Callable[[Path], None], durable: bool = True) -> None:
    """`write(tmp)` creates the file's content at `tmp` (for a library that writes files itself, such
    as safetensors' `save_file`, which skips building the whole file in memory first)."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    try:
        write(tmp)
        if durable:
            fd = os.open(tmp, os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)  # a failed write leaves the old file and no half-written temporary
        raise
    if durable:
        fd = os.open(path.parent, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def atomic_write_json(path: str | Path, obj: object, durable: bool = True) -> None:
    atomic_write(path, json.dumps(obj, indent=1, sort_keys=True).encode(), durable)


def read_json(path: str | Path) -> dict:
    return json.loads(Path(path).read_text())
