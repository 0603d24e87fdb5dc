"""Issue 29's acceptance for the Hugging Face Trainer: `DecoupledDiLoCoCallback` in real processes on
the CPU, a tiny `LlamaForCausalLM` from a config on local text, one learner under torchrun (2 ranks,
gloo DDP), one under torchrun with FSDP2, a learner killed with kill -9 that resumes from the
Trainer's checkpoint, and DeepSpeed refused."""

from __future__ import annotations

import json
import os
import shutil
import sys
from pathlib import Path

import pytest

pytest.importorskip("transformers", reason="the Hugging Face extra: pip install -e '.[hf]'")
pytest.importorskip("accelerate", reason="the Trainer needs accelerate: pip install -e '.[hf]'")

import ddiloco  # noqa: E402

from ..support.processes import wait_exit  # noqa: E402
from ..support.runtime import wait_for  # noqa: E402
from . import hf_learner  # noqa: E402

SCRIPT = Path(hf_learner.__file__)
TORCHRUN = Path(sys.executable).with_name("torchrun")
ENV = {"HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "OMP_NUM_THREADS": "1"}
STEP_TOKENS = hf_learner.SEQ * hf_learner.BATCH  # per rank


def synchronizer(tokens: int, learners: int = 2, **knobs) -> ddiloco.Synchronizer:
    knobs = {"sync_every": 4, "overlap": 1, "quorum": 1, "grace": 0.0, "heartbeat": 0.1, **knobs}
    return ddiloco.Synchronizer(hf_learner.build(), learners=learners, tokens=tokens, **knobs)


def learner(procs, tmp: Path, name: str, address: str, m: int, data: str, *extra: str, ranks: int = 1):
    out = tmp / name
    out.mkdir(exist_ok=True)
    launch = [sys.executable]
    if ranks > 1:
        torchrun = str(TORCHRUN) if TORCHRUN.exists() else shutil.which("torchrun")
        launch = [str(torchrun), "--standalone", "--nproc-per-node", str(ranks)]
    cmd = [*launch, str(SCRIPT), "--connect", address, "--id", str(m), "--data", data, "--out", str(out), *extra]
    procs.env = {**os.environ, **ENV}
    return procs.start(name, cmd, out / "stderr.log", out / "stdout.log"), out


def results(out: Path) -> dict[int, dict]:
    return {r["rank"]: r for r in (json.loads(p.read_text()) for p in sorted(out.glob("rank-*.json")))}


@pytest.mark.timeout(240)
@pytest.mark.skipif(not TORCHRUN.exists() and shutil.which("torchrun") is None, reason="torchrun not installed")
def test_two_trainer_learners_one_under_torchrun_merge_and_count_their_tokens(procs, tmp_path, corpus_file):
    budget = 60 * STEP_TOKENS
    sync = synchronizer(budget)
    address = sync.start()
    try:  # each waits for the other before its first step: the faster start must not train the whole budget
        wait = ("--wait-learners", "2")
        one, out1 = learner(procs, tmp_path, "single", address, 0, corpus_file, *wait)
        two, out2 = learner(procs, tmp_path, "torchrun", address, 1, corpus_file, *wait, ranks=2)
        codes = wait_exit([one, two], 180)
        status = sync.status()
    finally:
        sync.stop()
    assert codes == [0, 0], [(o / "stderr.log").read_text()[-3000:] for o in (out1, out2)]
    single, ranks = results(out1), results(out2)
    assert set(single) == {0} and set(ranks) == {0, 1}
    # (a) the synchronizer merged both learners' work
    books = status["books"]
    assert status["merges"] > 0 and all(books[str(m)]["contributions"] > 0 for m in (0, 1)), books
    assert all(books[str(m)]["tokens_merged"] > 0 for m in (0, 1)), books
    # (b) both ranks of the torchrun learner end with identical parameters, and trained the same steps
    assert ranks[0]["params_sha"] == ranks[1]["params_sha"]
    assert ranks[0]["global_step"] == ranks[1]["global_step"] > 0
    # the run's budget stopped both Trainers (max_steps 200 was never reached)
    assert all(r["global_step"] < 200 for r in (single[0], ranks[0])) and status["finished"]
    # (e) the tokens counted are the tokens trained: every optimizer step, every rank, once
    for r, world in ((single[0], 1), (ranks[0], 2), (ranks[1], 2)):
        assert r["client"]["steps"] == r["global_step"], r
        assert r["client"]["tokens"] == r["tokens_seen"] == r["global_step"] * STEP_TOKENS * world, r
    for m, r in ((0, single[0]), (1, ranks[0])):
        assert books[str(m)]["tokens_trained"] == r["client"]["tokens"], (books, r)


@pytest.mark.timeout(300)
@pytest.mark.skipif(not TORCHRUN.exists() and shutil.which("torchrun") is None, reason="torchrun not installed")
def test_a_trainer_learner_sharded_with_fsdp2_under_torchrun_merges_and_counts_its_tokens(procs, tmp_path, corpus_file):
    """The issue's "DDP and FSDP": `fsdp=True` (full shard) with `fsdp_config={"version": 2, ...}`, Accelerate
    shards each decoder layer and the model with `fully_shard` over gloo (2 ranks, CPU; Accelerate would
    drop FSDP on the CPU without `hf_learner.fsdp_on_cpu`, which says why). About 8 s. The callback
    hands the client the Trainer's model, whose parameters are then DTensor shards: rank 0 keeps a full
    copy for the algorithm and every rank applies its shard of each merge (as a hand-written FSDP2 loop)."""
    budget = 24 * STEP_TOKENS * 2
    sync = synchronizer(budget, learners=1)
    address = sync.start()
    try:
        two, out = learner(procs, tmp_path, "fsdp", address, 0, corpus_file, "--fsdp", ranks=2)
        codes = wait_exit([two], 240)
        status = sync.status()
    finally:
        sync.stop()
    assert codes == [0], (out / "stderr.log").read_text()[-4000:]
    ranks = results(out)
    assert set(ranks) == {0, 1}
    # FSDP2 really sharded the model: its parameters are DTensors, every one of them
    names = [n for n, _ in hf_learner.build().named_parameters()]
    assert all(r["sharded"] == sorted(names) for r in ranks.values()), ranks[0]["sharded"]
    # the synchronizer merged this learner's work, and the budget stopped the Trainer
    books = status["books"]["0"]
    assert status["merges"] > 0 and books["contributions"] > 0 and books["tokens_merged"] > 0, status["books"]
    assert status["finished"] and ranks[0]["global_step"] < 200
    # both ranks end with the same full (gathered) parameters, after the same steps
    assert ranks[0]["params_sha"] == ranks[1]["params_sha"]
    assert ranks[0]["global_step"] == ranks[1]["global_step"] > 0
    # the tokens counted are the tokens trained
    for r in ranks.values():
        assert r["client"]["steps"] == r["global_step"], r
        assert r["client"]["tokens"] == r["tokens_seen"] == r["global_step"] * STEP_TOKENS * 2, r
    assert books["tokens_trained"] == ranks[0]["client"]["tokens"], (books, ranks[0])


@pytest.mark.timeout(120)
def test_without_other_learners_the_callback_leaves_the_plain_trainers_loss_curve(procs, tmp_path, corpus_file):
    """(c): one learner, outer step 1 without momentum, fp32 both ways: each merge hands the learner its
    own parameters back, so the callback must change nothing: same losses as the plain Trainer's, same
    seed (its data order, RNG, optimizer state and learning rate are left alone). Arrivals re-based
    (`arrival="rebase"`): the steps taken since the snapshot are kept; "auto" overwrites them when
    K = 1 without grace (#33), which is another algorithm, not the plain Trainer's curve."""
    sync = synchronizer(10**9, learners=1, outer_lr=1.0, outer_momentum=0.0, codec_down="fp32", arrival="rebase")
    address = sync.start()
    try:
        joined, out = learner(
            procs, tmp_path, "joined", address, 0, corpus_file, "--max-steps", "16", "--codec", "fp32"
        )
        plain, plain_out = learner(procs, tmp_path, "plain", "", 0, corpus_file, "--max-steps", "16")
        codes = wait_exit([joined, plain], 100)
        merges = sync.status()["merges"]
    finally:
        sync.stop()
    assert codes == [0, 0], [(o / "stderr.log").read_text()[-3000:] for o in (out, plain_out)]
    (with_callback,), (without,) = results(out).values(), results(plain_out).values()
    assert merges >= 3 and with_callback["client"]["steps"] == 16 and without["client"]["steps"] is None
    assert len(with_callback["losses"]) == len(without["losses"]) == 16
    assert with_callback["losses"] == pytest.approx(without["losses"], rel=1e-5, abs=1e-6)


def saved_through(out: Path, step: int) -> bool:
    """The Trainer finished writing a checkpoint at `step` or later (its trainer_state.json parses)."""
    from ddiloco.integrations.transformers import last_checkpoint

    newest = last_checkpoint(out)
    return newest is not None and int(Path(newest).name.split("-")[1]) >= step


@pytest.mark.slow  # 10-15 s of processes; the default suite checks last_checkpoint by hand (below)
@pytest.mark.timeout(240)
def test_a_learner_killed_with_kill_9_resumes_from_its_checkpoint_and_rejoins(procs, tmp_path, corpus_file):
    """(d): kill -9 after the Trainer saved a checkpoint; `resume_from_checkpoint=True` rejoins the run."""
    sync = synchronizer(10**9, learners=1)
    address = sync.start()
    try:
        first, out = learner(procs, tmp_path, "learner", address, 0, corpus_file, "--save-steps", "5")
        # checkpoint-10 whole: a kill while it is written resumes from checkpoint-5, rightly, and would
        # not show a resume past the first save
        wait_for(lambda: saved_through(out, 10) or not first.alive(), 120, message="a whole checkpoint-10")
        assert first.alive(), (out / "stderr.log").read_text()[-3000:]
        procs.kill_tree(first)
        merged_before = sync.status()["merges"]
        second, _ = learner(
            procs, tmp_path, "learner", address, 0, corpus_file, "--save-steps", "5", "--max-steps", "24", "--resume"
        )
        codes = wait_exit([second], 150)
        status = sync.status()
    finally:
        sync.stop()
    assert codes == [0], (out / "stderr.log").read_text()[-3000:]
    (r,) = results(out).values()
    resumed = int(Path(r["resumed_from"]).name.split("-")[1])  # the newest whole checkpoint, maybe not the last
    assert resumed >= 10 and r["global_step"] == 24 and r["client"]["steps"] == 24 - resumed
    assert r["client"]["registrations"] >= 1 and r["client"]["accepted"] > 0
    assert status["merges"] > merged_before and status["double_merged_steps"] == 0


def test_last_checkpoint_is_the_newest_one_the_trainer_finished_writing(tmp_path):
    """What (d) resumes from: a kill -9 during a save leaves a checkpoint without (or with a torn)
    trainer_state.json, which the Trainer writes last; it is skipped, and so is anything else."""
    from ddiloco.integrations.transformers import last_checkpoint

    assert last_checkpoint(tmp_path) is None
    for step, state in ((5, "{}"), (10, '{"global_step": 10}'), (15, '{"global_st'), (20, None)):
        (tmp_path / f"checkpoint-{step}").mkdir()
        if state is not None:
            (tmp_path / f"checkpoint-{step}" / "trainer_state.json").write_text(state)
    (tmp_path / "checkpoint-99.tmp").mkdir()
    (tmp_path / "checkpoint-30").write_text("a file, not a folder")
    assert last_checkpoint(tmp_path) == str(tmp_path / "checkpoint-10")
