"""A learner sharded with FSDP2 (`fully_shard`, 2 ranks under torchrun, gloo on the CPU) trains the
same global model as the same learner in one process: each rank applies and snapshots its own
shards, the synchronizer receives whole fragments."""

from __future__ import annotations

import json
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


def run_learner(tmp_path: Path, shakespeare: Path, name: str, ranks: int, attach: bool = False) -> tuple[dict, str]:
    out = tmp_path / f"{name}.safetensors"
    # blocking syncs (overlap 0) and one learner: the same steps meet the same updates in both runs
    # fp32 updates: in bf16 a rounding step apart in the two runs' sums would be a visible difference
    with ddiloco.Synchronizer(
        model(), learners=1, fragments=3, sync_every=H, overlap=0, outer_lr=0.7, outer_momentum=0.9, codec_down="fp32"
    ) as sync:
        launcher = (
            [sys.executable]
            if ranks == 1
            else [
                str(TORCHRUN) if TORCHRUN.exists() else shutil.which("torchrun"),
                "--standalone",
                "--nproc-per-node",
                str(ranks),
            ]
        )
        done = subprocess.run(
            [
                *launcher,
                str(SCRIPT),
                sync.address,
                str(shakespeare),
                str(STEPS),
                str(out),
                *(["attach"] if attach else []),
            ],
            capture_output=True,
            text=True,
            timeout=240,
        )
        assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-4000:]
        status = sync.status()
    return load_file(out), done.stdout + str(status)


@pytest.mark.timeout(400)
@pytest.mark.skipif(not TORCHRUN.exists() and shutil.which("torchrun") is None, reason="torchrun not installed")
def test_fsdp_learner_trains_the_same_global_model_as_one_process(tmp_path, shakespeare):
    """Also through `client.attach` (#29): the optimizer's step hook on an FSDP2 learner under
    torchrun is the same step boundary as `client.step`."""
    single, _ = run_learner(tmp_path, shakespeare, "single", 1)
    sharded, log = run_learner(tmp_path, shakespeare, "fsdp", 2)
    attached, attach_log = run_learner(tmp_path, shakespeare, "fsdp-attach", 2, attach=True)
    initial = dict(model().named_parameters())
    assert set(sharded) == set(single) == set(attached) == set(initial)
    for name in single:
        assert not torch.allclose(single[name], initial[name].detach()), f"{name} never changed"
        for got, why in ((sharded, log), (attached, attach_log)):
            assert torch.allclose(got[name], single[name], atol=1e-5, rtol=1e-5), (
                name,
                float((got[name] - single[name]).abs().max()),
                why[-1500:],
            )


PEER_SCRIPT = Path(__file__).resolve().parents[1] / "support" / "fsdp_peer_learner.py"


@pytest.mark.timeout(300)
@pytest.mark.skipif(not TORCHRUN.exists() and shutil.which("torchrun") is None, reason="torchrun not installed")
def test_an_fsdp_learner_takes_a_peers_inner_state_in_shards_and_donates_its_own_gathered(procs, tmp_path, shakespeare):
    from ..support.runtime import wait_for

    torchrun = str(TORCHRUN) if TORCHRUN.exists() else shutil.which("torchrun")

    def start(name: str, learner: int, ranks: int):
        out = tmp_path / f"{name}.json"
        launcher = [sys.executable] if ranks == 1 else [torchrun, "--standalone", "--nproc-per-node", str(ranks)]
        child = procs.start(
            name,
            [*launcher, str(PEER_SCRIPT), sync.address, str(shakespeare), str(learner), str(out)],
            tmp_path / f"{name}.err",
            tmp_path / f"{name}.out",
        )
        return child, out

    def ended(child, out):
        wait_for(lambda: not child.alive(), 90, message=f"{out.stem} to finish")
        assert out.is_file(), (tmp_path / f"{out.stem}.err").read_text()[-3000:]
        return json.loads(out.read_text())

    with ddiloco.Synchronizer(model(), learners=2, fragments=3, sync_every=4, overlap=1) as sync:
        first, first_out = start("plain-1", 1, 1)
        wait_for(
            lambda: sync.status().get("learners", {}).get("1", {}).get("step", 0) >= 20,
            90,
            message="the first donor to train",
        )
        # an FSDP learner on an empty machine: rank 0 takes the donor's state, each rank keeps its shards
        fsdp, fsdp_out = start("fsdp-0", 0, 2)
        wait_for(
            lambda: sync.status().get("books", {}).get("0", {}).get("contributions", 0) >= 2,
            120,
            message="the FSDP learner to contribute",
        )
        Path(str(first_out) + ".stop").touch()
        plain = ended(first, first_out)
        # a new learner 1, empty: the only live donor is the FSDP learner, which gathers its shards
        second, second_out = start("plain-1b", 1, 1)
        wait_for(
            lambda: (
                second_out.with_name("plain-1b.err").is_file()
                and "took its inner state" in second_out.with_name("plain-1b.err").read_text()
            ),
            90,
            message="the new learner to recover",
        )
        wait_for(
            lambda: sync.status().get("books", {}).get("1", {}).get("contributions", 0) >= plain["accepted"] + 2,
            90,
            message="the new learner's contributions",
        )
        sync.request_stop("test is done")
        got_fsdp, got_second = ended(fsdp, fsdp_out), ended(second, second_out)
    assert got_fsdp["world"] == 2 and got_fsdp["recovered"]["donor"] == 1 and got_fsdp["recovered"]["step"] > 0
    # what the two ranks hold together, gathered right after start, is exactly what was donated
    assert got_fsdp["after_start"] == got_fsdp["recovered"]["checksum"]
    assert got_second["recovered"]["donor"] == 0 and got_second["recovered"]["step"] > got_fsdp["recovered"]["step"]
    assert got_second["after_start"] == got_second["recovered"]["checksum"]
    donated = (tmp_path / "fsdp-0.err").read_text()
    assert f"checksum {got_second['recovered']['checksum']}" in donated and len(got_fsdp["donations"]) == 1
    assert got_fsdp["accepted"] > 0 and got_second["accepted"] > 0
