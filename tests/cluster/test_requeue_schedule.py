"""The requeues the Slurm benchmarks do (benchmarks/chaos_slurm.py, shared with time_to_loss.py's
preemptible scenario), against a stand-in `scontrol requeue`: due entries only, ddiloco's learner jobs
and the data-parallel worker jobs alike, a job not running skipped, one schedule for every run."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from rich.console import Console

from ddiloco.cluster import slurm

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

import chaos_slurm  # noqa: E402

QUIET = Console(file=open("/dev/null", "w"))


def test_due_requeues_hit_running_learner_or_worker_jobs_only(monkeypatch):
    requeued: list[str] = []
    monkeypatch.setattr(slurm, "requeue", lambda job, hold=False: requeued.append(job))
    pending = [(1.0, 0), (2.0, 1), (3.0, 0), (9.0, 1)]
    jobs = {"sync0": "10", "learner0": "11", "learner1": "12"}
    states = {"sync0": "RUNNING", "learner0": "RUNNING", "learner1": "PENDING"}
    assert chaos_slurm.requeue_due(pending, 3.5, jobs, states, QUIET) == 2  # learner 1 not running: skipped
    assert requeued == ["11", "11"] and pending == [(9.0, 1)]
    workers = {"worker0": "20", "worker1": "21"}
    assert chaos_slurm.requeue_due(pending, 10.0, workers, {"worker1": "RUNNING"}, QUIET) == 1
    assert requeued[-1] == "21" and pending == []


def test_a_requeue_slurm_refuses_is_skipped(monkeypatch):
    def refuse(job: str, hold: bool = False) -> None:
        raise slurm.SlurmError("scontrol requeue failed: job is not running")

    monkeypatch.setattr(slurm, "requeue", refuse)
    pending = [(0.0, 0)]
    assert chaos_slurm.requeue_due(pending, 1.0, {"learner0": "1"}, {"learner0": "RUNNING"}, QUIET) == 0
    assert pending == []


def test_held_requeues_are_released_after_the_wait(monkeypatch):
    calls: list[tuple[str, str]] = []
    monkeypatch.setattr(slurm, "requeue", lambda job, hold=False: calls.append(("hold" if hold else "requeue", job)))
    monkeypatch.setattr(slurm, "release", lambda job: calls.append(("release", job)))
    held: list[tuple[float, str]] = []
    pending = [(1.0, 0), (4.0, 1)]
    jobs = {"learner0": "11", "learner1": "12"}
    running = {"learner0": "RUNNING", "learner1": "RUNNING"}
    assert chaos_slurm.requeue_due(pending, 1.5, jobs, running, QUIET, held, wait=5.0) == 1
    assert calls == [("hold", "11")] and held == [(6.5, "11")]
    chaos_slurm.release_due(held, 6.0, QUIET)
    assert calls == [("hold", "11")]  # its wait is not over
    assert chaos_slurm.requeue_due(pending, 6.6, jobs, running, QUIET, held, wait=5.0) == 1
    chaos_slurm.release_due(held, 6.6, QUIET)
    assert calls[1:] == [("hold", "12"), ("release", "11")] and held == [(11.6, "12")]


def test_one_schedule_for_every_run():
    a = chaos_slurm.schedule(4, 40.0, 300.0, seed=0)
    assert a == chaos_slurm.schedule(4, 40.0, 300.0, seed=0) and a == sorted(a)
    assert all(0 <= t < 300.0 and 0 <= m < 4 for t, m in a) and len(a) > 10


def test_the_preemptible_scenario_falls_back_to_local_and_says_why(monkeypatch):
    import time_to_loss_slurm as tls

    with tls.slurm_or_local("local", QUIET) as (env, note):
        assert env is None and "--preemptible-backend local" in note

    def no_cluster(console: Console) -> tuple:
        raise SystemExit("no Slurm cluster: Slurm is not installed")

    monkeypatch.setattr(chaos_slurm, "cluster", no_cluster)
    with tls.slurm_or_local(None, QUIET) as (env, note):
        assert env is None and "Slurm could not be had" in note and "not installed" in note
    stopped: list = []
    monkeypatch.setattr(chaos_slurm, "cluster", lambda console: (Path("/nonexistent"), {"SLURM_CONF": "x"}))
    monkeypatch.setattr(chaos_slurm, "stop_cluster", stopped.append)
    with tls.slurm_or_local("slurm", QUIET) as (env, note):
        assert env == {"SLURM_CONF": "x"} and "Slurm backend for all four" in note
    assert stopped == [Path("/nonexistent")]  # the private cluster is stopped on the way out


def test_on_slurm_the_preemptible_runs_get_requeues_and_the_virtual_clock_the_same_outages(tmp_path):
    import argparse

    import time_to_loss as ttl

    from ddiloco.chaos.trace import FailureTrace

    args = argparse.Namespace(
        scenarios=["preemptible"], learners=4, failure_speedup=6.0, seed=0, cap_seconds=300.0, min_step_seconds=0.1
    )
    (sc,) = ttl.scenarios(args, tmp_path, 1000, ({"SLURM_CONF": "x"}, "on Slurm"))
    assert sc.slurm == {"SLURM_CONF": "x"} and sc.note == "on Slurm" and sc.requeues
    assert sc.requeues == chaos_slurm.schedule(4, 4 * 60.0 / 6.0, 300.0, 0)  # per learner: 4 x the job-wide 10 s
    outages = FailureTrace.load(sc.trace).outages  # overlapping outages of one learner are merged
    for t, m in sc.requeues:  # down from every requeue for the nominal wait (30 s / 6)
        assert any(o.learner == m and o.down_at <= t + 1e-6 and o.up_at >= t + 5.0 - 1e-6 for o in outages)
    assert all(any(o.up_at == pytest.approx(t + 5.0) for t, m in sc.requeues) for o in outages)
    more = {"model_size": "tiny", "data": "d", "seq_len": 16, "batch_size": 4, "tokens": 1000, "eval_batches": 1}
    more["inner_optimizer"] = "muon"
    flags = ttl.sim_flags(
        argparse.Namespace(**vars(args), **more, reconfigure_seconds=1.0), sc, "decoupled", {"inner_lr": 3e-3}
    )
    assert flags[flags.index("--chaos-trace") + 1] == str(sc.trace)  # the virtual clock gets the outages
