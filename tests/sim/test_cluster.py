"""Decoupled DiLoCo on the virtual clock: quorum and grace under heterogeneity, failures, accounting."""

from dataclasses import replace

import pytest

from ddiloco.chaos.trace import random_trace
from ddiloco.core import AlgorithmConfig
from ddiloco.sim.cluster import DecoupledCluster
from ddiloco.sim.hardware import LinkModel, StepTimeModel, half_slow
from ddiloco.sim.run import run_sim

from .helpers import sim_config

HETERO = StepTimeModel(speeds=half_slow(4, 1.2), jitter=0.1)


def run(task, quorum, grace, steps=HETERO, failures=None, learners=4, **knobs):
    algorithm = AlgorithmConfig(fragments=2, sync_every=8, overlap=2, quorum=quorum, grace=grace, **knobs)
    kw = {} if failures is None else {"failures": failures}
    config = sim_config(learners=learners, steps_per_learner=40, algorithm=algorithm, steps=steps, **kw)
    return DecoupledCluster(config, task).run()


def test_k1_alone_merges_the_opener_grace_admits_the_slower_learners_and_k_m_admits_all(tiny_task):
    paper = dict(late="refuse", arrival="overwrite")  # late work thrown away, as the paper has it
    k1 = run(tiny_task, quorum=1, grace=0.0, **paper)
    k1_grace = run(tiny_task, quorum=1, grace=0.5, **paper)
    km = run(tiny_task, quorum=4, grace=0.0, **paper)
    k1_late_merged = run(tiny_task, quorum=1, grace=0.0, arrival="rebase")
    per_merge = {
        name: s["contributions"] / s["outer_steps"] for name, s in [("k1", k1), ("k1_grace", k1_grace), ("km", km)]
    }
    assert per_merge["k1"] < 2.0  # mostly the opener: with jitter, few contributions arrive at once
    assert per_merge["k1_grace"] > 3.0
    assert per_merge["km"] > 3.7  # all but learners that declined (an update still in flight to them)
    # Nobody waits in any of them: the learners compute all the time...
    for stats in (k1, k1_grace, km):
        assert stats["utilization"] > 0.9
    # ...but K=1 alone throws most of that work away, which is what the grace window recovers, and
    # what merging late work with re-based arrivals keeps without one (at a cost in quality: each
    # learner's progress is then applied one after another, so `--arrival auto`, the default,
    # overwrites there: docs/results.md, "Keeping the work").
    assert k1["goodput"] < 0.45 < 0.8 < k1_grace["goodput"]
    assert k1_late_merged["goodput"] > 0.8 and k1_late_merged["rejected_contributions"] == 0


def test_k1_without_grace_admits_every_contribution_that_arrives_with_the_quorum(tiny_task):
    # identical learners: all four snapshots of a fragment reach the synchronizer at the same instant
    stats = run(tiny_task, quorum=1, grace=0.0, steps=StepTimeModel())
    assert stats["rejected_contributions"] == 0
    assert stats["contributions"] >= 3.5 * stats["outer_steps"]
    assert stats["goodput"] > 0.85 and stats["tokens_merged"] <= stats["tokens_trained"]


def test_failures_cost_the_failed_learners_work_but_the_global_model_keeps_advancing(tiny_task):
    trace = random_trace(4, horizon=400.0, mean_time_between_failures=30.0, mean_downtime=6.0, seed=3)
    healthy = run(tiny_task, quorum=1, grace=0.5, steps=StepTimeModel())
    failing = run(tiny_task, quorum=1, grace=0.5, steps=StepTimeModel(), failures=trace)
    assert failing["utilization"] < healthy["utilization"] - 0.05
    assert failing["goodput"] < healthy["goodput"]
    assert failing["uptime"] > 0.95  # someone is always doing work that counts
    assert failing["longest_gap_seconds"] < 8.0  # never a stall longer than a sync period
    assert failing["tokens_merged"] <= failing["tokens_trained"] if "tokens_trained" in failing else True


def test_goodput_accounting_is_consistent(tiny_task):
    stats = run(tiny_task, quorum=1, grace=0.5)
    assert 0 < stats["goodput"] <= stats["utilization"] <= 1
    assert 0 < stats["tokens_merged"] <= stats["tokens_trained"]
    assert stats["goodput"] == pytest.approx(
        stats["tokens_merged"] / stats["tokens_trained"] * stats["utilization"], rel=0.15
    )


def test_outer_gradients_go_through_the_wire_codec(tiny_task):
    runs = {c: run_sim(sim_config(codec=c), task=tiny_task) for c in (None, "fp32", "int4")}
    assert runs["fp32"]["eval_loss"] == runs[None]["eval_loss"]  # fp32 is lossless
    assert runs["int4"]["eval_loss"] != runs[None]["eval_loss"]  # int4 is not, and the values say so
    # Bytes per fragment on the link: fp32 4 per parameter; int4 half a byte plus a 4-byte scale per 64.
    assert runs["int4"]["peak_step_bytes"] < runs["fp32"]["peak_step_bytes"] / 6
    with pytest.raises(ValueError, match="int3"):
        sim_config(codec="int3")


def test_plain_averaging_shrinks_the_merged_outer_gradient_rda_does_not(tiny_task):
    algorithm = AlgorithmConfig(fragments=1, sync_every=4, overlap=0, quorum=4, grace=0.0)
    ratio = {
        merge: run_sim(sim_config(learners=4, algorithm=replace(algorithm, merge=merge)), task=tiny_task)[
            "outer_norm_ratio"
        ]
        for merge in ("mean", "rda")
    }
    assert ratio["rda"] == pytest.approx(1.0, abs=0.02)  # RDA keeps the contributions' mean norm
    assert ratio["mean"] < 0.9 * ratio["rda"]


def test_a_restarted_learners_refused_duplicate_does_not_relabel_its_dead_incarnations_merged_work(tiny_task):
    from ddiloco.chaos.trace import FailureTrace, Outage

    # blocking syncs, learner 1 three times slower: learner 0's first snapshot waits in the round
    # while it dies and comes back; its new incarnation's snapshot for the same round is a duplicate
    algorithm = AlgorithmConfig(fragments=1, sync_every=4, overlap=0, quorum=2, grace=0.0)
    config = sim_config(
        learners=2,
        steps_per_learner=12,
        algorithm=algorithm,
        steps=StepTimeModel(speeds=(1.0, 3.0)),
        failures=FailureTrace.of([Outage(4.2, 0, 4.5)]),
    )
    cluster = DecoupledCluster(config, tiny_task)
    stats = cluster.run()
    assert any("duplicate" in r for r in cluster.rejections)
    runs = cluster.ledger._runs
    assert runs[(0, 0)].share == [1.0] * 4  # the dead incarnation's four steps were merged: credited to it
    assert runs[(0, 1)].share[:4] == [0.0] * 4  # not to the steps its successor took at the same indices
    assert stats["tokens_merged"] <= stats["tokens_trained"]


def test_rebase_keeps_the_work_that_overwrite_throws_away(tiny_task):
    runs = {}
    for arrival in ("overwrite", "rebase"):
        algorithm = AlgorithmConfig(fragments=2, sync_every=8, overlap=2, quorum=4, grace=0.0, arrival=arrival)
        config = sim_config(learners=4, steps_per_learner=40, algorithm=algorithm, steps=StepTimeModel())
        runs[arrival] = DecoupledCluster(config, tiny_task).run()
    overwrite, rebase = runs["overwrite"], runs["rebase"]
    # identical learners, no failures: every trained token reaches the model once (the ledger raises on twice)
    assert rebase["tokens_merged"] == pytest.approx(rebase["tokens_trained"])
    assert overwrite["tokens_merged"] < 0.97 * overwrite["tokens_trained"]  # tau of every H steps overwritten
    assert rebase["goodput"] > overwrite["goodput"]


def test_rebase_keeps_work_refused_as_stale_and_merges_every_token_once(tiny_task):
    """K = 1 without grace, heterogeneous learners and a link of 0.3 step times: answers to a round's
    requests arrive after it merged and are refused as stale. With rebase, a learner left out keeps
    that work and sends it with its next contribution (`FragmentUpdate.merged`): far more of the
    trained tokens reach the model, and the ledger (which raises on a step merged twice) shows none
    of it is counted twice."""
    runs = {}
    for arrival, late in (("overwrite", "refuse"), ("rebase", "refuse"), ("rebase", "merge")):
        algorithm = AlgorithmConfig(
            fragments=2, sync_every=8, overlap=2, quorum=1, grace=0.0, arrival=arrival, late=late
        )
        config = sim_config(
            learners=4,
            steps_per_learner=40,
            algorithm=algorithm,
            steps=HETERO,
            link=LinkModel(latency=0.3, bandwidth=1e15, merge_rate=1e15),
        )
        runs[arrival if late == "refuse" else "late-merged"] = DecoupledCluster(config, tiny_task).run()
    share = {k: s["tokens_merged"] / s["tokens_trained"] for k, s in runs.items()}
    assert all(runs[k]["rejected_contributions"] >= 5 for k in ("overwrite", "rebase"))  # late work refused
    assert share["overwrite"] < 0.5 and share["rebase"] > 0.85, share  # without keeping it: 0.43
    assert runs["rebase"]["tokens_merged"] <= runs["rebase"]["tokens_trained"]
    assert runs["rebase"]["goodput"] > runs["overwrite"]["goodput"] + 0.3
    # merged late instead: nothing refused, and (the ledger raises on a step merged twice) once
    assert runs["late-merged"]["rejected_contributions"] == 0 and share["late-merged"] > 0.85, share
