"""Data-parallel baselines: stall (not elastic) or pause-and-continue (elastic) around a failure."""

import pytest

from ddiloco.chaos.trace import FailureTrace, Outage
from ddiloco.sim.ddp import DataParallel

from .helpers import TOKENS_PER_STEP, sim_config


def run(task, method, failures=None, **kw):
    failures = FailureTrace() if failures is None else failures
    config = sim_config(method=method, learners=4, steps_per_learner=20, failures=failures, **kw)
    driver = DataParallel(config, task)
    return driver.run()


def test_without_failures_both_are_plain_synchronous_training(tiny_task):
    a = run(tiny_task, "ddp")
    b = run(tiny_task, "elastic-ddp")
    a.pop("wall_seconds"), b.pop("wall_seconds")
    assert a == b
    assert a["inner_steps"] == 20  # each step consumes all four learners' batches
    assert a["tokens_trained"] == 4 * 20 * TOKENS_PER_STEP
    assert a["sim_seconds"] == pytest.approx(20.0)
    assert a["goodput"] == pytest.approx(1.0) and a["uptime"] == pytest.approx(1.0)


def test_not_elastic_stalls_until_the_learner_is_back_and_loses_the_interrupted_step(tiny_task):
    stats = run(tiny_task, "ddp", FailureTrace.of([Outage(5.5, 1, 15.5)]))
    # steps 1..5 end at 5.0; the step started at 5.0 dies at 5.5; nothing runs until 15.5; 15 more steps
    assert stats["lost_steps"] == 1
    assert stats["sim_seconds"] == pytest.approx(15.5 + 15.0)
    assert stats["longest_gap_seconds"] == pytest.approx(11.5)
    assert stats["uptime"] == pytest.approx(20.0 / 30.5)
    assert stats["goodput"] == pytest.approx(20.0 / 30.5)


def test_elastic_pauses_on_each_change_and_goes_on_with_the_live_learners(tiny_task):
    stats = run(tiny_task, "elastic-ddp", FailureTrace.of([Outage(5.5, 1, 15.5)]), reconfigure_seconds=2.0)
    # 5 full steps; step lost at 5.5; pause to 7.5; 3-learner steps 7.5..15.5 (8 steps) ;
    # membership grows at 15.5 (checked at a step boundary) -> pause to 17.5; then 4-learner steps.
    assert stats["lost_steps"] == 1
    tokens_after = 4 * 20 * TOKENS_PER_STEP - 5 * 4 * TOKENS_PER_STEP - 8 * 3 * TOKENS_PER_STEP
    four_learner_steps = -(-tokens_after // (4 * TOKENS_PER_STEP))
    assert stats["inner_steps"] == 5 + 8 + four_learner_steps
    assert stats["sim_seconds"] == pytest.approx(17.5 + four_learner_steps)
    assert stats["goodput"] < 1.0 and stats["uptime"] < 1.0


def test_a_straggler_slows_every_synchronous_step(tiny_task):
    from ddiloco.sim.hardware import StepTimeModel

    stats = run(tiny_task, "ddp", steps=StepTimeModel(speeds=(1.0, 1.0, 1.0, 2.0)))
    assert stats["sim_seconds"] == pytest.approx(40.0)
    # three learners compute 1 s and wait 1 s of every 2 s; the slow one computes all the time
    assert stats["goodput"] == pytest.approx((3 * 20 + 40) / (4 * 40))
