"""A real Slurm cluster for the whole session (tests/support/slurm_cluster.py), all daemons on
127.0.0.1; tests that need it skip with the reason when Slurm cannot run here."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

import pytest

from ..support import slurm_cluster


@pytest.fixture(scope="session")
def slurm():
    reason = slurm_cluster.missing()
    if reason:
        pytest.skip(reason)
    d = Path(tempfile.mkdtemp(prefix="ddiloco-slurm-"))
    try:
        slurm_cluster.start(d)
    except (RuntimeError, OSError, FileNotFoundError) as exc:
        pytest.skip(f"the local Slurm cluster did not start: {exc}")
    previous = os.environ.get("SLURM_CONF")
    os.environ["SLURM_CONF"] = str(d / "slurm.conf")
    try:
        yield d
    finally:
        slurm_cluster.stop(d)
        if previous is None:
            os.environ.pop("SLURM_CONF", None)
        else:
            os.environ["SLURM_CONF"] = previous
