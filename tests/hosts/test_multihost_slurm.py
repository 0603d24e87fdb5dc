"""Issue 28's Slurm across hosts: slurmctld on host `ctl`, one slurmd per host (distinct `NodeAddr`s,
198.18 addresses), munged of its own (tests/hosts/slurm_hosts.py); every test *slow*, skipped without
Slurm or root.

- a 2-node job whose `srun` runs one task on each host, each seeing its own host's address;
- `ddiloco run --backend slurm --nodes-per-learner 2`, launched inside host `ctl`: the synchronizer's
  job listens on its host's address, the learner's job runs one torchrun on each of two hosts (c10d
  rendezvous at the first node's NodeAddr, gloo between the hosts), the run reaches its budget and
  the tokens add up;
- the same learner's job requeued (`scontrol requeue`) after its first node is drained: it starts
  again on two nodes, one of them new, its new process group rejoins and its work is merged, and
  `ddiloco slurm-stop` ends the run cleanly with every token accounted.

What it took is in docs/hosts.md ("Slurm across hosts")."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from ddiloco.cluster import slurm as jobs_api
from ddiloco.learner.journal import read_journals
from ddiloco.records.events import read_events

from ..support import slurm_cluster as sc
from ..support.runtime import wait_for
from .slurm_hosts import SlurmHosts, slurm_hosts

TOKEN = "slurm-hosts-token"
TOKENS_PER_STEP = 4 * 16  # one rank's tokens per step (--batch-size 4, --seq-len 16)
NODES = ["n1", "n2", "n3"]  # the synchronizer's job and a 2-node learner, and a third host to move to


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_one_slurmd_per_host_runs_a_two_node_job(tmp_path):
    reason = sc.missing()
    if reason:
        pytest.skip(reason)
    with slurm_hosts(tmp_path / "slurm", ["n1", "n2"]) as cluster:
        out = tmp_path / "job.out"
        task = tmp_path / "task.sh"  # a file: expanded where each task runs, not by the batch script's shell
        task.write_text("echo \"$SLURMD_NODENAME $(ip -4 -o addr show eth0 | awk '{print $4}')\"\n")
        done = cluster.run("sbatch", "-N2", "-o", str(out), "--wait", "--wrap", f"srun -N2 bash {task}", timeout=120)
        assert done.returncode == 0, (done.stdout, done.stderr)
        lines = [line.split() for line in out.read_text().splitlines() if line.strip()]
        assert len(lines) == 2, lines
        seen = dict(lines)
        # one task on each host, at that host's own address (each slurmd its own NodeAddr)
        assert seen == {"n1": f"{cluster.net.address('n1')}/15", "n2": f"{cluster.net.address('n2')}/15"}, seen


@pytest.fixture(scope="module")
def hosts_cluster(tmp_path_factory):
    """slurmctld on `ctl`, one slurmd on each of n1..n3 (CPUs=2 each), for the runs of this module."""
    reason = sc.missing()
    if reason:
        pytest.skip(reason)
    with slurm_hosts(tmp_path_factory.mktemp("slurm-hosts") / "slurm", NODES) as cluster:
        yield cluster


def ddiloco(cluster: SlurmHosts, *args: str, timeout: float) -> subprocess.CompletedProcess:
    """`ddiloco ...` inside host ctl, where its sbatch, squeue and gRPC calls reach the cluster."""
    return cluster.run(sys.executable, "-m", "ddiloco", *args, timeout=timeout, env={"DDILOCO_TOKEN": TOKEN})


def slurm_run(cluster: SlurmHosts, run: Path, data: str, budget: int, *extra: str, timeout: float):
    """`ddiloco run --backend slurm` of one learner of 2 nodes (one torchrun each); the synchronizer's
    listen address is left to its job (`--sync-host auto`: the first address of its host)."""
    return ddiloco(
        cluster,
        *("run", "--backend", "slurm", "--json", "--learners", "1", "--nodes-per-learner", "2"),
        *("--model-size", "tiny", "--seq-len", "16", "--data", data, "--batch-size", "4"),
        *("--fragments", "2", "--sync-every", "4", "--heartbeat", "0.2", "--threads", "1"),
        *("--min-step-seconds", "0.04", "--tokens", str(budget), "--term-grace", "5", "--run-dir", str(run)),
        *extra,
        timeout=timeout,
    )


def learner_log(run: Path) -> str:
    return "".join(p.read_text(errors="replace") for p in sorted((run / "learner-0").glob("slurm-*.out")))


def starts(run: Path) -> list[dict[str, str]]:
    """Each start of learner 0's job, in order: node -> the address it found for itself (its NodeAddr),
    from the line every node of the job writes before its torchrun starts."""
    found: list[dict[str, str]] = []
    for line in learner_log(run).splitlines():
        if line.startswith("learner job ") and " start " in line:
            found.append({})
        elif line.startswith("learner node ") and found:
            words = line.split()
            found[-1][words[2]] = words[4].rstrip(",")
    return found


def ranks(log: str) -> set[tuple[str, str]]:
    """(rank/world, Slurm node) of every rank that started training, from its log line."""
    got = set()
    for line in log.splitlines():
        if " rank " in line and "(Slurm node " in line:
            got.add((line.split(" rank ", 1)[1].split()[0], line.rsplit("(Slurm node ", 1)[1].rstrip(")")))
    return got


def merges(run: Path, after: float = 0.0) -> list[dict]:
    """The synchronizer's merges that took learner 0's work, at or after wall time `after`."""
    path = run / "sync-0" / "events.jsonl"
    events = read_events(path) if path.is_file() else []
    return [e for e in events if e["kind"] == "merge" and 0 in e["learners"] and e["t"] >= after]


def check_tokens(run: Path, final: dict) -> list[dict]:
    """Every journal's tokens are its steps times both ranks' tokens; nothing merged that was not trained."""
    journals = [j for j in read_journals(run / "learner-0", "journal-*.json") if j]
    assert journals
    for j in journals:
        assert j["tokens"] == (j["position"] - j["start_position"]) * TOKENS_PER_STEP * 2, j
    trained = sum(j["tokens"] for j in journals)
    assert final["double_merged_steps"] == 0
    assert 0 < final["books"]["0"]["tokens_merged"] <= trained
    assert 0 < final["tokens_merged"] <= trained and final["tokens_reported"] <= trained
    return journals


def check_synchronizer_address(cluster: SlurmHosts, run: Path) -> None:
    """The synchronizer listens on, and advertises, its host's own address (`hostname -I`), never loopback."""
    host = (run / "sync-0" / "address").read_text().strip().rsplit(":", 1)[0]
    assert host in {cluster.net.address(n) for n in NODES}, host


def job_states(cluster: SlurmHosts, jobs: dict[str, str]) -> dict[str, str]:
    """role -> state of the run's jobs as squeue (inside ctl) knows them; GONE once it forgot one."""
    out = cluster.run("squeue", "-h", "-t", "all", "-o", "%i %T", "-j", ",".join(jobs.values()))
    by_id = dict(line.split()[:2] for line in out.stdout.splitlines() if len(line.split()) >= 2)
    return {role: by_id.get(job, "GONE") for role, job in jobs.items()}


@pytest.mark.slow
@pytest.mark.timeout(360)
def test_a_learner_of_two_nodes_runs_a_torchrun_on_each_host_with_gloo_between_them(
    hosts_cluster, tmp_path, shakespeare
):
    cluster, run = hosts_cluster, tmp_path / "run"
    budget = 2 * 150 * TOKENS_PER_STEP
    done = slurm_run(cluster, run, shakespeare, budget, timeout=300)  # follows the run to its end
    assert done.returncode == 0, (done.stderr[-3000:], learner_log(run)[-3000:])
    result = json.loads(done.stdout.strip().splitlines()[-1])
    final = result["summary"]
    assert final["finished"] and final["tokens_reported"] >= budget, final
    assert final["books"]["0"]["contributions"] > 0 and merges(run)
    check_synchronizer_address(cluster, run)
    # one torchrun on each of two hosts, each at its own NodeAddr, gloo bound to the host's interface
    (nodes,) = starts(run)
    assert len(nodes) == 2 and all(addr == cluster.net.address(n) for n, addr in nodes.items()), nodes
    assert learner_log(run).count(", gloo eth0") == 2
    # both ranks trained, one on each host: DDP's gradients went over gloo between the two hosts
    assert {rank for rank, _ in ranks(learner_log(run))} == {"0/2", "1/2"}
    assert {node for _, node in ranks(learner_log(run))} == set(nodes)
    check_tokens(run, final)
    states = job_states(cluster, result["jobs"])
    assert set(states.values()) <= jobs_api.FINISHED | {"GONE"}, states  # nothing left queued or running


@pytest.mark.slow
@pytest.mark.timeout(480)
def test_a_learner_job_requeued_onto_another_host_rejoins_and_the_run_ends_cleanly(
    hosts_cluster, tmp_path, shakespeare
):
    cluster, run = hosts_cluster, tmp_path / "run"
    cluster.wait_queue_empty()
    cluster.wait_idle()
    submit = slurm_run(cluster, run, shakespeare, 10**9, "--detach", timeout=120)
    assert submit.returncode == 0, submit.stderr[-3000:]
    jobs = json.loads(submit.stdout.strip().splitlines()[-1])["jobs"]
    drained = None
    try:
        wait_for(lambda: len(merges(run)) >= 6, 240, message=f"merges of the learner's work (see {run})")
        check_synchronizer_address(cluster, run)
        before = wait_for(lambda: cluster.nodes_of(jobs["learner0"]), 10, message="the learner job's nodes")
        assert len(before) == 2 and set(starts(run)[0]) == set(before), (before, starts(run))
        # its first node (the rendezvous host) can take no new job; requeued, it must start elsewhere
        drained = before[0]
        cluster.set_state(drained, "drain")
        cluster.scontrol("requeue", jobs["learner0"])
        moved = wait_for(
            lambda: len(starts(run)) >= 2 and len(starts(run)[1]) == 2 and starts(run)[1],
            180,
            message="the requeued learner job to start again on two nodes",
        )
        assert drained not in moved and set(moved) != set(before), (before, moved)
        assert all(addr == cluster.net.address(n) for n, addr in moved.items()), moved
        # its new process group rejoins: its journal, then its work merged after it started
        second = wait_for(
            lambda: (lambda js: len(js) >= 2 and max(js, key=lambda j: j["started"]))(
                [j for j in read_journals(run / "learner-0", "journal-*.json") if j]
            ),
            120,
            message="the requeued learner's new journal",
        )
        wait_for(lambda: len(merges(run, after=second["started"])) >= 6, 180, message="merges of the requeued learner")
        stopped = ddiloco(cluster, "slurm-stop", str(run), timeout=150)  # learners send their work, then leave
        assert stopped.returncode == 0, stopped.stderr[-2000:]
    finally:
        if drained is not None:
            cluster.set_state(drained, "resume")
        cluster.run("scancel", *jobs.values())
    final = json.loads((run / "sync-0" / "summary.json").read_text())
    assert final["stopping"] and final["books"]["0"]["contributions"] >= 12, final
    first, last = sorted(check_tokens(run, final), key=lambda j: j["started"])  # read again: final states
    assert last["incarnation"] == second["incarnation"] != first["incarnation"]
    assert last["start_position"] <= first["position"]  # it went on from what was merged, nothing skipped
    assert first["state"] == "done" and last["state"] == "done"  # each sent its work and left (SIGTERM)
    assert set(job_states(cluster, jobs).values()) <= jobs_api.FINISHED | {"GONE"}
    # the ranks of both starts: two hosts each time, one of them new
    log = learner_log(run)
    assert "start 0 on" in log and "start 1 on" in log  # the same job, started again by Slurm
    assert {node for _, node in ranks(log)} == set(before) | set(moved)
