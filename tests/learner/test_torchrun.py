"""A learner that is itself a torchrun job (2 ranks, gloo): rank 0 talks, every rank gets the update."""

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import ddiloco

from ..support.fsdp_learner import model
from ..support.processes import (
    TOKENS_PER_STEP,
    model_args,
    start_synchronizer,
    wait_exit,
)

TORCHRUN = Path(sys.executable).with_name("torchrun")


@pytest.mark.slow  # the default suite keeps the restart and peer-recovery tests, which train 2-rank learners too
@pytest.mark.timeout(150)
@pytest.mark.skipif(not TORCHRUN.exists() and shutil.which("torchrun") is None, reason="torchrun not installed")
def test_two_rank_torchrun_learner_trains_and_syncs(procs, tmp_path, shakespeare):
    budget = 300 * 2 * TOKENS_PER_STEP
    sync, address = start_synchronizer(procs, tmp_path, shakespeare, 1, 0, "--tokens", str(budget))
    d = tmp_path / "learner-0"
    d.mkdir()
    torchrun = str(TORCHRUN) if TORCHRUN.exists() else shutil.which("torchrun")
    cmd = [
        torchrun,
        "--standalone",
        "--nproc-per-node",
        "2",
        "-m",
        "ddiloco",
        "learner",
        "--connect",
        address,
        "--id",
        "0",
        *model_args(shakespeare, 1),
        "--batch-size",
        "4",
        "--threads",
        "1",
        "--state-dir",
        str(d),
        "--json",
    ]
    learner = procs.start("torchrun", cmd, d / "stderr.log", d / "stdout.log")
    assert wait_exit([learner, sync], 120) == [0, 0], (d / "stderr.log").read_text()[-3000:]
    stats = [json.loads(line) for line in (d / "stdout.log").read_text().splitlines() if line.startswith("{")]
    by_rank = {s["rank"]: s for s in stats}
    assert set(by_rank) == {0, 1} and all(s["world"] == 2 for s in stats)
    leader, other = by_rank[0], by_rank[1]
    # one rank talked to the synchronizer ...
    assert leader["accepted"] > 0 and leader["registrations"] == 1
    assert other["pushed"] == 0 and other["registrations"] == 0
    # ... and every rank applied the same updates at the same steps: identical parameters
    assert leader["params_sha"] == other["params_sha"]
    assert leader["steps"] == other["steps"] and leader["tokens"] == 2 * leader["steps"] * TOKENS_PER_STEP
    assert max(leader["versions"]) > 1
    final = json.loads((tmp_path / "sync" / "summary.json").read_text())
    assert final["tokens_reported"] == leader["tokens"] and final["merges"] > 0


@pytest.mark.timeout(150)
def test_learner_trains_in_bf16_on_the_resolved_device(procs, tmp_path, shakespeare):
    from ..support.processes import start_learner

    budget = 120 * TOKENS_PER_STEP
    sync, address = start_synchronizer(procs, tmp_path, shakespeare, 1, 0, "--tokens", str(budget))
    learner = start_learner(
        procs, tmp_path, shakespeare, 1, address, 0, "--precision", "bf16", "--device", "auto", "--json"
    )
    d = tmp_path / "learner-0"
    assert wait_exit([learner, sync], 120) == [0, 0], (d / "stderr.log").read_text()[-3000:]
    stats = json.loads([line for line in (d / "stdout.log").read_text().splitlines() if line.startswith("{")][-1])
    assert stats["accepted"] > 0 and stats["rejected"] == 0
    assert " in bf16" in (d / "stderr.log").read_text()
    final = json.loads((tmp_path / "sync" / "summary.json").read_text())
    assert final["merges"] > 0 and final["tokens_reported"] == stats["tokens"]


def _rank_pid(torchrun_pid: int, rank: int) -> int | None:
    """The PID of one rank of a torchrun job, found among the agent's descendants by its RANK variable."""
    from ddiloco.launch.procs import descendants

    for pid, _ in descendants(torchrun_pid):
        try:
            env = open(f"/proc/{pid}/environ", "rb").read().split(b"\0")
        except OSError:
            continue
        if f"RANK={rank}".encode() in env and b"LOCAL_RANK=" + str(rank).encode() in env:
            return pid
    return None


@pytest.mark.timeout(240)
@pytest.mark.skipif(not TORCHRUN.exists() and shutil.which("torchrun") is None, reason="torchrun not installed")
def test_a_rank_killed_with_kill9_makes_torchrun_restart_the_group_which_rejoins(
    procs, tmp_path, shakespeare, monkeypatch
):
    import os
    import signal

    from ..support.processes import journals, start_learner, status, stop_run
    from ..support.runtime import wait_for

    sync, address = start_synchronizer(procs, tmp_path, shakespeare, 2, 0, "--tokens", str(10**9))
    d = tmp_path / "learner-0"
    d.mkdir()
    torchrun = str(TORCHRUN) if TORCHRUN.exists() else shutil.which("torchrun")
    # torch's own workaround for restarts (pytorch#135712): a restarted group must not read the
    # previous round's addresses from a store shared with the agent; the sbatch scripts set it too
    monkeypatch.setenv("TORCH_DISABLE_SHARE_RDZV_TCP_STORE", "1")
    group = procs.start(
        "torchrun",
        [
            torchrun,
            "--standalone",
            "--nproc-per-node",
            "2",
            "--max-restarts",
            "2",
            "-m",
            "ddiloco",
            "learner",
            "--connect",
            address,
            "--id",
            "0",
            *model_args(shakespeare, 2),
            "--batch-size",
            "4",
            "--threads",
            "1",
            "--state-dir",
            str(d),
            "--min-step-seconds",
            "0.03",
        ],
        d / "stderr.log",
        d / "stdout.log",
    )
    other = start_learner(procs, tmp_path, shakespeare, 2, address, 1, "--min-step-seconds", "0.03")
    wait_for(
        lambda: all(status(address).get("books", {}).get(str(m), {}).get("contributions", 0) >= 2 for m in range(2)),
        120,
        message="both learners to contribute",
    )
    rank1 = wait_for(lambda: _rank_pid(group.pid, 1), 10, message="rank 1 of the torchrun learner")
    os.kill(rank1, signal.SIGKILL)
    killed = status(address)
    # the synchronizer goes on with the other learner: the global model advances while the group restarts
    wait_for(lambda: status(address)["version_sum"] >= killed["version_sum"] + 4, 30, message="merges meanwhile")
    wait_for(lambda: len(journals(tmp_path, 0)) >= 2, 120, message="torchrun's restarted group to rejoin")
    rejoined = status(address)["books"]["0"]["contributions"]
    wait_for(
        lambda: status(address)["books"]["0"]["contributions"] >= rejoined + 2,
        90,
        message="contributions of the restarted group",
    )
    assert group.alive(), "torchrun gave up instead of restarting the group"
    stop_run(address)
    assert wait_exit([group, other, sync], 90) == [0, 0, 0], (d / "stderr.log").read_text()[-3000:]
    first, second = sorted(journals(tmp_path, 0), key=lambda j: j["started"])
    assert second["start_position"] <= first["position"] and second["steps"] > 0


@pytest.mark.timeout(200)
@pytest.mark.skipif(not TORCHRUN.exists() and shutil.which("torchrun") is None, reason="torchrun not installed")
def test_a_two_rank_learner_on_an_empty_disk_takes_a_peers_inner_state_on_every_rank(procs, tmp_path, shakespeare):
    from ..support.processes import start_learner, status, stop_run
    from ..support.runtime import wait_for

    sync, address = start_synchronizer(procs, tmp_path, shakespeare, 2, 0, "--tokens", str(10**9))
    donor = start_learner(procs, tmp_path, shakespeare, 2, address, 1, "--min-step-seconds", "0.02")
    wait_for(
        lambda: status(address).get("learners", {}).get("1", {}).get("step", 0) >= 20, 90, message="the donor to train"
    )
    d = tmp_path / "learner-0"
    d.mkdir()
    torchrun = str(TORCHRUN) if TORCHRUN.exists() else shutil.which("torchrun")
    group = procs.start(
        "torchrun",
        [
            torchrun,
            "--standalone",
            "--nproc-per-node",
            "2",
            "-m",
            "ddiloco",
            "learner",
            "--connect",
            address,
            "--id",
            "0",
            *model_args(shakespeare, 2),
            "--batch-size",
            "4",
            "--threads",
            "1",
            "--state-dir",
            str(d),
            "--max-steps",
            "40",
            "--json",
        ],
        d / "stderr.log",
        d / "stdout.log",
    )
    assert wait_exit([group], 120) == [0], (d / "stderr.log").read_text()[-3000:]
    stop_run(address)
    assert wait_exit([donor, sync], 60) == [0, 0]
    stats = {
        s["rank"]: s
        for s in (json.loads(line) for line in (d / "stdout.log").read_text().splitlines() if line.startswith("{"))
    }
    assert set(stats) == {0, 1} and stats[0]["recovered"]["donor"] == 1 and stats[0]["recovered"]["step"] > 0
    # rank 1 took the same state from rank 0: after 40 identical steps both hold the same moments
    assert stats[0]["inner_sha"] == stats[1]["inner_sha"] and stats[0]["params_sha"] == stats[1]["params_sha"]


FINISH_SCRIPT = Path(__file__).resolve().parents[1] / "support" / "finish_learner.py"


@pytest.mark.timeout(200)
@pytest.mark.parametrize("layout", ["replicated", "fsdp"])
@pytest.mark.skipif(not TORCHRUN.exists() and shutil.which("torchrun") is None, reason="torchrun not installed")
def test_a_value_rank_0_takes_while_finishing_reaches_every_rank(tmp_path, shakespeare, layout):
    """finish() is called while rank 0 still waits for the merge of a contribution: that merge's
    value arrives inside finish(), and every rank ends with the same model."""
    out = tmp_path / "ranks"
    torchrun = str(TORCHRUN) if TORCHRUN.exists() else shutil.which("torchrun")
    # one fragment, streaming (overlap 1): the value of a push comes back a step or more later
    with ddiloco.Synchronizer(model(), learners=1, fragments=1, sync_every=4, overlap=1) as sync:
        done = subprocess.run(
            [torchrun, "--standalone", "--nproc-per-node", "2", str(FINISH_SCRIPT), sync.address, str(shakespeare)]
            + [str(out), *(["fsdp"] if layout == "fsdp" else [])],
            capture_output=True,
            text=True,
            timeout=180,
        )
    assert done.returncode == 0, done.stderr[-3000:]
    ranks = [json.loads(Path(f"{out}-{r}.json").read_text()) for r in (0, 1)]
    leader = ranks[0]
    assert leader["after"][0] > leader["before"][0], f"no value arrived inside finish(): {leader}"
    assert ranks[0]["digest"] == ranks[1]["digest"], "the ranks left with different models"


@pytest.mark.timeout(200)
@pytest.mark.skipif(not TORCHRUN.exists() and shutil.which("torchrun") is None, reason="torchrun not installed")
def test_the_ranks_of_a_learner_whose_synchronizer_is_killed_end_together_with_exit_code_3(
    procs, tmp_path, shakespeare
):
    """Issue 46: rank 0 finds the orphan timeout passed; every rank leaves the loop at the same step and
    ends with the same reason and code (torchrun, given no restarts, then ends too)."""
    from ddiloco.learner.ending import EXIT_ORPHANED

    from ..support.processes import journals, status
    from ..support.runtime import wait_for

    sync, address = start_synchronizer(procs, tmp_path, shakespeare, 1, 0, "--max-staleness", "1000")
    d = tmp_path / "learner-0"
    d.mkdir()
    torchrun = str(TORCHRUN) if TORCHRUN.exists() else shutil.which("torchrun")
    cmd = [torchrun, "--standalone", "--nproc-per-node", "2", "--max-restarts", "0", "-m", "ddiloco", "learner"]
    cmd += ["--connect", address, "--id", "0", *model_args(shakespeare, 1), "--batch-size", "4", "--threads", "1"]
    cmd += ["--state-dir", str(d), "--min-step-seconds", "0.03", "--orphan-timeout", "4", "--json"]
    group = procs.start("torchrun", cmd, d / "stderr.log", d / "stdout.log")
    wait_for(
        lambda: status(address).get("books", {}).get("0", {}).get("contributions", 0) >= 2,
        120,
        message="the torchrun learner to contribute",
    )
    procs.kill_tree(sync)  # kill -9, never restarted
    (code,) = wait_exit([group], 120)
    assert code is not None and code != 0, (d / "stderr.log").read_text()[-3000:]
    stats = [json.loads(line) for line in (d / "stdout.log").read_text().splitlines() if line.startswith("{")]
    by_rank = {s["rank"]: s for s in stats}
    assert set(by_rank) == {0, 1}, stats
    assert {s["exit_code"] for s in stats} == {EXIT_ORPHANED}
    assert by_rank[0]["ended"] == by_rank[1]["ended"] and "orphan timeout" in by_rank[0]["ended"]
    assert by_rank[0]["steps"] == by_rank[1]["steps"]  # they left the loop at the same step
    (journal,) = journals(tmp_path, 0)  # rank 0's, kept
    assert journal["state"] == "orphaned"
    assert f"exitcode  : {EXIT_ORPHANED}" in (d / "stderr.log").read_text()  # torchrun's report of the ranks
