"""Streaming DiLoCo on the virtual clock: every learner in every round, and fast learners wait for
slow ones once a fragment is more than tau steps overdue (where decoupled's never wait)."""

from dataclasses import replace

from ddiloco.core import AlgorithmConfig
from ddiloco.sim.cluster import DecoupledCluster
from ddiloco.sim.hardware import StepTimeModel

from .helpers import sim_config

ASKED = AlgorithmConfig(fragments=4, sync_every=8, overlap=2, quorum=1, grace=0.5, outer_lr=0.3, merge="rda")
SLOW_LAST = StepTimeModel(speeds=(1.0, 1.0, 2.0))  # learner 2 takes twice as long per step


def run(task, method: str, steps: StepTimeModel = SLOW_LAST) -> tuple[DecoupledCluster, dict, list[dict]]:
    """The run's cluster, summary and merges (each marked `final` when it merges the final flush)."""
    merges: list[dict] = []
    algorithm = AlgorithmConfig(fragments=2, sync_every=8, overlap=2, quorum=1, grace=0.5)
    config = sim_config(method, learners=3, steps_per_learner=40, algorithm=algorithm, steps=steps)
    cluster = DecoupledCluster(
        config,
        task,
        observer=lambda kind, time, details: (
            merges.append({**details, "final": cluster.draining}) if kind == "merge" else None
        ),
    )
    return cluster, cluster.run(), merges


def test_streaming_admits_every_learner_in_every_merge(tiny_task):
    cluster, stats, merges = run(tiny_task, "streaming")
    assert cluster.algorithm.fragments == 2 and cluster.algorithm.overlap == 2  # fragments and overlap kept
    training = [m for m in merges if not m["final"]]  # at the end, a learner with nothing unsent declines
    assert len(training) >= 8 and stats["rejected_contributions"] == 0
    assert all(sorted(m["learners"]) == [0, 1, 2] for m in training), [m["learners"] for m in merges]


def test_with_a_slow_learner_the_fast_ones_wait_in_streaming_but_not_in_decoupled(tiny_task):
    streaming, s_stats, _ = run(tiny_task, "streaming")
    decoupled, d_stats, _ = run(tiny_task, "decoupled")
    assert all(learner.waited > 0 for learner in streaming.learners[:2])  # held back by learner 2
    assert s_stats["wait_seconds"] == sum(learner.waited for learner in streaming.learners)
    assert all(learner.waited == 0 for learner in decoupled.learners) and d_stats["wait_seconds"] == 0
    assert s_stats["utilization"] < d_stats["utilization"]


def test_equal_learners_never_wait_more_than_the_link_takes(tiny_task):
    # identical learners on an instant link: every merged value is back before tau steps are up
    streaming, stats, merges = run(tiny_task, "streaming", steps=StepTimeModel())
    assert stats["wait_seconds"] == 0 and all(len(m["learners"]) == 3 for m in merges if not m["final"])


def test_every_entry_point_derives_the_same_algorithm():
    from ddiloco.cli.synchronizer import algorithm_for as service_algorithm
    from ddiloco.launch.config import RunConfig
    from ddiloco.sim.config import SimConfig

    sim = SimConfig(method="streaming", learners=3, algorithm=ASKED).effective_algorithm()
    knobs = {k: v for k, v in ASKED.to_dict().items() if k != "merge"}
    assert service_algorithm("streaming", 3, **knobs, merge=None) == replace(sim, merge="mean")
    assert (
        service_algorithm("diloco", 3, **knobs, merge="rda")
        == SimConfig(method="diloco", learners=3, algorithm=ASKED).effective_algorithm()
    )
    run = RunConfig(run_dir=".", method="streaming", learners=3, algorithm=ASKED, tokens=1)
    assert run.algorithm == sim  # what its synchronizers are told to run
    assert {k: run.as_dict()[k] for k in ("fragments", "quorum", "grace", "merge")} == {
        "fragments": ASKED.fragments,
        "quorum": 3,
        "grace": 0.0,
        "merge": ASKED.merge,
    }
