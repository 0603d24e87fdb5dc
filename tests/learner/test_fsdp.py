"""A learner sharded with FSDP2 (`fully_shard`, 2 ranks under torchrun, gloo on the CPU) trains the
same global model as the same learner in one process: each rank applies and snapshots its own
shards, the synchronizer receives whole fragments."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

import ddiloco

from ..support.fsdp_learner import model

SCRIPT = Path(__file__).resolve().parents[1] / "support" / "fsdp_learner.py"
TORCHRUN = Path(sys.executable).with_name("torchrun")
STEPS, H = 24, 4


def run_learner(tmp_path: Path, shakespeare: Path, name: str, ranks: int) -> tuple[dict, str]:
    out = tmp_path / f"{name}.safetensors"
    # blocking syncs (overlap 0) and one learner: the same steps meet the same updates in both runs
    with ddiloco.Synchronizer(model(), learners=1, fragments=3, sync_every=H, overlap=0, outer_lr=0.7,
                              outer_momentum=0.9) as sync:
        launcher = [sys.executable] if ranks == 1 else [
            str(TORCHRUN) if TORCHRUN.exists() else shutil.which("torchrun"), "--standalone", "--nproc-per-node",
            str(ranks)]
        done = subprocess.run([*launcher, str(SCRIPT), sync.address, str(shakespeare), str(STEPS), str(out)],
                              capture_output=True, text=True, timeout=240)
        assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-4000:]
        status = sync.status()
    return load_file(out), done.stdout + str(status)


@pytest.mark.timeout(400)
@pytest.mark.skipif(not TORCHRUN.exists() and shutil.which("torchrun") is None, reason="torchrun not installed")
def test_fsdp_learner_trains_the_same_global_model_as_one_process(tmp_path, shakespeare):
    single, _ = run_learner(tmp_path, shakespeare, "single", 1)
    sharded, log = run_learner(tmp_path, shakespeare, "fsdp", 2)
    initial = dict(model().named_parameters())
    assert set(sharded) == set(single) == set(initial)
    for name in single:
        assert not torch.allclose(single[name], initial[name].detach()), f"{name} never changed"
        assert torch.allclose(sharded[name], single[name], atol=1e-5, rtol=1e-5), (
            name, float((sharded[name] - single[name]).abs().max()), log[-1500:])
