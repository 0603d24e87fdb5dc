"""The inner-optimizer options in the simulator (`ddiloco sim` builds its learners' optimizers and
schedule from `SimConfig.inner`): the learning rate warms up again after each adoption; Muon and the
slow momentum train, and a restarted learner copies a peer's state of either."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest

from ddiloco.chaos.trace import FailureTrace, Outage
from ddiloco.core import AlgorithmConfig
from ddiloco.sim import cluster as sim_cluster
from ddiloco.sim.cluster import DecoupledCluster
from ddiloco.train.inner import lr_at as real_lr_at
from ddiloco.train.optimizers import MuonWithAdamW, SlowFastAdamW

from .helpers import FLAT_INNER, sim_config

PERIOD = 4


def synchronous(learners: int = 2, rounds: int = 3, **inner: object):  # noqa: ANN201
    """Classic DiLoCo (one fragment, blocking, every learner in every round): each learner adopts the
    merged model after every H = 4 steps."""
    algorithm = AlgorithmConfig(fragments=1, sync_every=PERIOD, overlap=0, quorum=learners, merge="mean")
    return sim_config(
        learners=learners, steps_per_learner=PERIOD * rounds, algorithm=algorithm, inner=replace(FLAT_INNER, **inner)
    )


def test_the_learning_rate_warms_up_again_after_each_adoption(tiny_task, monkeypatch):
    seen: list[tuple[int | None, float]] = []

    def recording(config, step, progress, since_adoption=None):  # noqa: ANN001, ANN202
        lr = real_lr_at(config, step, progress, since_adoption)
        seen.append((since_adoption, lr))
        return lr

    monkeypatch.setattr(sim_cluster, "lr_at", recording)
    DecoupledCluster(synchronous(rewarm_steps=2), tiny_task).run()
    assert len(seen) == 2 * 3 * PERIOD
    # joined at step 0, then a merged model after every 4 steps: 0, 1, 2, 3 steps since, each round
    assert sorted({since for since, _ in seen}) == [0, 1, 2, 3]
    assert [since for since, _ in seen].count(0) == 2 * 3
    lr = FLAT_INNER.lr
    for since, got in seen:
        assert got == pytest.approx(lr / 2 if since == 0 else lr), since  # R = 2: (0 + 1) / 2, then full


def test_without_rewarm_the_schedule_ignores_adoptions(tiny_task, monkeypatch):
    seen: list[float] = []
    monkeypatch.setattr(sim_cluster, "lr_at", lambda *a: seen.append(real_lr_at(*a)) or real_lr_at(*a))
    DecoupledCluster(synchronous(), tiny_task).run()
    assert seen and set(seen) == {FLAT_INNER.lr}


@pytest.mark.parametrize(
    ("inner", "kind"), [({"optimizer": "muon"}, MuonWithAdamW), ({"slow_momentum": 0.99}, SlowFastAdamW)]
)
def test_each_optimizer_trains_and_a_restarted_learner_copies_a_peer_s_state(tiny_task, monkeypatch, inner, kind):
    config = replace(
        sim_config(learners=3, steps_per_learner=12, inner=replace(FLAT_INNER, **inner)),
        failures=FailureTrace.of([Outage(down_at=3.5, learner=1, up_at=5.5)]),
    )
    rejoined: list[tuple[type, int]] = []
    rejoin = DecoupledCluster._rejoin_optimizer

    def recording(self, learner):  # noqa: ANN001, ANN202
        optimizer = rejoin(self, learner)
        rejoined.append((type(optimizer), len(optimizer.state)))
        return optimizer

    monkeypatch.setattr(DecoupledCluster, "_rejoin_optimizer", recording)
    cluster = DecoupledCluster(config, tiny_task)
    stats = cluster.run()
    assert all(isinstance(learner.optimizer, kind) for learner in cluster.learners)
    assert stats["outer_steps"] > 0 and math.isfinite(tiny_task.evaluate(cluster.global_model(), 2)["eval_loss"])
    params = len(list(cluster.learners[1].model.parameters()))
    assert rejoined == [(kind, params)]  # before its first step, every parameter's state: a peer's
