"""The Slurm side of the data-parallel baselines without a cluster (docs/dataparallel.md): the worker's
job script, the job table's reading of Slurm (restart counts are incarnations), and the launcher's
decisions when a worker's job is requeued: `ddp` requeues every other job, `elastic-ddp` does not."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from ddiloco.backends.dataparallel import slurm_launcher
from ddiloco.chaos.injector import ChaosSettings
from ddiloco.cluster import dataparallel_jobs as dj
from ddiloco.cluster import slurm
from ddiloco.cluster.sbatch import SlurmOptions
from ddiloco.dataparallel import slurm as dps
from ddiloco.dataparallel.config import DataParallelConfig
from ddiloco.dataparallel.rendezvous import Membership
from ddiloco.dataparallel.storeauth import read_secret


def config(tmp_path: Path, method: str = "ddp") -> DataParallelConfig:
    return DataParallelConfig(run_dir=tmp_path / "run", method=method, workers=2, tokens=1000, model_size="tiny")


def test_the_worker_script_is_a_requeueable_job_that_reaches_the_store_at_the_given_address(tmp_path: Path):
    assert dps.INCARNATION == dj.INCARNATION  # the two sides agree on the placeholder
    argv = dps.worker_argv(config(tmp_path), 1, "10.1.2.3", 4567, 12.5)
    opts = SlurmOptions(partition="gpu", time_limit="1:00:00", extra=("--qos=preempt",), python="/usr/bin/python3")
    paths = dj.write_worker_scripts(tmp_path / "run", {1: argv}, opts)
    text = paths[1].read_text()
    assert paths[1] == tmp_path / "run" / "slurm" / "worker1.sbatch"
    for line in ("#SBATCH --requeue", "#SBATCH --partition=gpu", "#SBATCH --time=1:00:00", "#SBATCH --qos=preempt"):
        assert line in text
    assert f"#SBATCH --output={(tmp_path / 'run' / 'learner-1').resolve()}/slurm-%j.out" in text
    run = [line for line in text.splitlines() if line.startswith("exec srun --ntasks=1 ")]
    assert len(run) == 1 and dj.INCARNATION not in text
    assert "--store-host 10.1.2.3" in run[0] and "--store-port 4567" in run[0] and "--slot 1" in run[0]
    assert run[0].endswith('--incarnation "${SLURM_RESTART_COUNT:-0}"')


def test_store_host_is_given_or_an_address_of_this_host():
    assert dj.store_host("10.0.0.7") == "10.0.0.7"
    auto = dj.store_host("auto")
    assert auto.count(".") == 3 and all(part.isdigit() for part in auto.split("."))


def test_a_job_is_alive_while_queued_or_running_as_the_incarnation_awaited():
    job = dj.WorkerJob(0, "7")
    assert job.alive() and not job.running() and job.poll() is None  # queued
    job.state = "RUNNING"
    assert job.running()
    job.restarts = 1  # Slurm requeued it: the incarnation awaited is gone
    assert not job.alive() and job.poll() == -15
    job.expected, job.state = 1, "COMPLETED"
    assert job.poll() == 0
    job.state = "FAILED"
    assert job.poll() == 1


class FakeSlurm:
    """squeue, sbatch, scontrol requeue and scancel on a table of jobs: {id: [state, restarts]}."""

    def __init__(self) -> None:
        self.jobs: dict[str, list] = {}
        self.calls: list[list[str]] = []

    def run(self, args: list[str], timeout: float = 60.0) -> str:
        self.calls.append(args)
        if args[0] == "sbatch":
            job = str(100 + len(self.jobs))
            self.jobs[job] = ["PENDING", 0]
            return job + "\n"
        if args[0] == "squeue":
            wanted = args[-1].split(",")
            return "".join(f"{j} {s} {r}\n" for j, (s, r) in self.jobs.items() if j in wanted)
        if args[:2] == ["scontrol", "requeue"]:
            if self.jobs[args[2]][0] == "PENDING":
                raise slurm.SlurmError("scontrol requeue failed: Job is pending execution")
            self.jobs[args[2]] = ["PENDING", self.jobs[args[2]][1] + 1]
            return ""
        if args[0] == "scancel":
            for j in args[1:]:
                self.jobs[j][0] = "CANCELLED"
            return ""
        raise AssertionError(args)


@pytest.fixture
def fake(monkeypatch: pytest.MonkeyPatch) -> FakeSlurm:
    f = FakeSlurm()
    monkeypatch.setattr(slurm, "_run", f.run)
    return f


def test_the_job_table_requeues_restarts_and_takes_the_incarnation_slurm_requeued(tmp_path: Path, fake: FakeSlurm):
    scripts = {0: tmp_path / "w0.sbatch", 1: tmp_path / "w1.sbatch"}
    table = dj.WorkerJobs(tmp_path, scripts, poll=0.0)
    a, b = table.submit(0), table.submit(1)
    assert json.loads(slurm.jobs_file(tmp_path).read_text()) == {"worker0": a.job, "worker1": b.job}
    fake.jobs[a.job][0] = fake.jobs[b.job][0] = "RUNNING"
    table.refresh()
    assert a.running() and b.running()
    fake.jobs[b.job] = ["PENDING", 1]  # preempted: scontrol requeue from outside
    table.refresh()
    assert not b.alive() and b.poll() == -15
    table.restart(b)  # the launcher takes the new incarnation; no new job
    assert b.expected == 1 and b.alive() and not b.running()
    table.kill_tree(a)  # ddp: the survivor's job is requeued too
    assert a.expected == 1 and fake.jobs[a.job] == ["PENDING", 1]
    table.kill_tree(b)  # already queued: nothing to requeue
    assert b.expected == 1 and fake.jobs[b.job] == ["PENDING", 1]
    fake.jobs[a.job][0] = "FAILED"
    table.refresh()
    table.restart(a)  # an ended job is requeued
    assert a.expected == 2 and a.alive() and fake.jobs[a.job] == ["PENDING", 2]
    table.stop_all(grace=0.0)
    assert all(state == "CANCELLED" for state, _ in fake.jobs.values())


class FakeTable:
    """A job table that runs nothing: the test plays Slurm by setting the jobs' states."""

    def __init__(self, argvs: dict[int, list[str]]) -> None:
        self.argvs = argvs
        self.jobs = {m: dj.WorkerJob(m, str(m)) for m in argvs}
        self.killed: list[int] = []
        self.truth: dict[int, tuple[str, int]] = {}  # slot -> (state, restarts) squeue shows, not yet seen

    def submit(self, slot: int) -> dj.WorkerJob:
        return self.jobs[slot]

    def refresh(self, force: bool = False) -> None:
        if force:  # what squeue says now: the requeues the launcher has not seen yet
            for m, (state, restarts) in self.truth.items():
                self.jobs[m].state, self.jobs[m].restarts = state, restarts
            self.truth = {}

    def restart(self, job: dj.WorkerJob) -> None:
        job.expected, job.pid = max(job.expected, job.restarts), 0

    def kill_tree(self, job: dj.WorkerJob) -> None:
        self.killed.append(job.slot)
        job.restarts = job.expected = job.expected + 1
        job.state, job.pid = "PENDING", 0

    def cancel_pending(self) -> None:
        pass

    def stop_all(self, grace: float = 5.0) -> None:
        pass


def seen_within(condition: Callable[[], bool], seconds: float = 5.0) -> None:
    """What a worker wrote to the store, once the launcher's side sees it (bounded)."""
    deadline = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < deadline, "the launcher never saw what the worker wrote"
        time.sleep(0.01)


def start(launcher: dps.SlurmLauncher, table: FakeTable) -> list[Membership]:
    """Every job running and said hello as its incarnation; the launcher opens the first generation."""
    for slot in launcher.slots:
        launcher._start(slot)
    hellos = []
    for m, job in table.jobs.items():
        job.state = "RUNNING"
        secret = read_secret(launcher.secret_file)  # the store's values are signed (storeauth)
        hellos.append(Membership(launcher.coordinator.port, m, timeout=5, secret=secret))
        hellos[-1].hello(1000 + m, job.expected)
    for m, job in table.jobs.items():
        seen_within(lambda m=m, job=job: launcher.coordinator.hello(m) == (1000 + m, job.expected))
    launcher._check_workers()
    launcher._decide()
    return hellos


@pytest.mark.parametrize("method", ["ddp", "elastic-ddp"])
def test_a_requeued_worker_restarts_the_whole_ddp_job_but_only_leaves_the_elastic_one(tmp_path: Path, method: str):
    tables: list[FakeTable] = []

    def factory(argvs: dict[int, list[str]]) -> FakeTable:
        tables.append(FakeTable(argvs))
        return tables[-1]

    launcher = dps.SlurmLauncher(config(tmp_path, method), factory, "127.0.0.1")
    table = tables[0]
    assert "--store-host" in table.argvs[0] and launcher.config.learner_down == 0.0
    secret_file = table.argvs[0][table.argvs[0].index("--store-secret-file") + 1]  # a path, not the secret
    assert secret_file == str(launcher.secret_file) and read_secret(launcher.secret_file).decode() not in table.argvs[0]
    hellos = start(launcher, table)
    assert launcher.coordinator.generation == 1 and launcher.pids == {0: 1000, 1: 1001}
    table.jobs[1].restarts, table.jobs[1].state = 1, "PENDING"  # scontrol requeue of worker 1's job
    launcher._check_workers()
    launcher._decide()
    assert table.jobs[1].expected == 1  # the requeued incarnation is the one awaited now
    if method == "ddp":
        assert launcher.job_restarts == 1 and table.killed == [0]  # the survivor's job is requeued too
        assert launcher.coordinator.generation == 1  # no generation until both incarnations said hello
    else:
        assert launcher.job_restarts == 0 and table.killed == []
        assert launcher.coordinator.generation == 2 and launcher.coordinator.members == [0]
    generation = launcher.coordinator.generation
    hellos[1].hello(2001, 0)  # a late hello of the old incarnation is not taken
    seen_within(lambda: launcher.coordinator.hello(1) == (2001, 0))
    table.jobs[1].state = "RUNNING"
    launcher._check_workers()
    launcher._decide()
    assert launcher.coordinator.generation == generation
    for m, job in table.jobs.items():
        job.state = "RUNNING"
        hellos[m].hello(3000 + m, job.expected)
    for m, job in table.jobs.items():
        seen_within(lambda m=m, job=job: launcher.coordinator.hello(m) == (3000 + m, job.expected))
    launcher._check_workers()
    launcher._decide()
    assert launcher.coordinator.members == [0, 1] and launcher.pids == {0: 3000, 1: 3001}
    launcher.events.close()
    launcher.log.close()


def test_the_cli_refuses_what_ddp_on_slurm_cannot_do(tmp_path: Path):
    text = tmp_path / "text.txt"
    text.write_text("to be or not to be, that is the question. " * 200)
    base = ["run", "--method", "ddp", "--backend", "slurm", "--run-dir", str(tmp_path / "r"), "--data", str(text)]
    cmd = [sys.executable, "-m", "ddiloco", *base, "--detach", "--model-size", "tiny"]
    result = subprocess.run(cmd, capture_output=True, text=True, timeout=120, env={**os.environ, "COLUMNS": "300"})
    assert result.returncode == 2 and "--detach" in result.stderr, result.stderr[-2000:]  # a usage error
    assert not (tmp_path / "r" / "slurm").exists()  # nothing written, nothing submitted
    with pytest.raises(ValueError, match="--learner-mtbf"):
        slurm_launcher({}, ChaosSettings(learner_mtbf=30.0))
    with pytest.raises(ValueError, match="--procs-per-node"):
        slurm_launcher({"procs_per_node": 2}, ChaosSettings())
    assert callable(slurm_launcher({"host": "127.0.0.1"}, ChaosSettings()))


def test_a_failure_reported_before_squeue_showed_the_requeue_does_not_name_the_preempted_worker(tmp_path: Path):
    """elastic-ddp: the survivor's collective fails at once; the launcher's last squeue is older than the
    requeue. It asks Slurm again before regrouping, so the survivor is not named with a dead peer."""
    tables: list[FakeTable] = []
    launcher = dps.SlurmLauncher(
        config(tmp_path, "elastic-ddp"), lambda argvs: tables.append(FakeTable(argvs)) or tables[-1], "127.0.0.1"
    )
    table = tables[0]
    hellos = start(launcher, table)
    assert launcher.coordinator.members == [0, 1]
    table.truth[1] = ("PENDING", 1)  # requeued; the launcher's view still says RUNNING
    hellos[0].report_failure(1)
    seen_within(lambda: launcher.coordinator.failed_in(0) == 1)  # a store's set is not acknowledged
    launcher._check_workers()
    launcher._decide()
    assert launcher.coordinator.generation == 2 and launcher.coordinator.members == [0]
    launcher.events.close()
    launcher.log.close()
