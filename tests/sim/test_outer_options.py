"""The outer step's options in the simulator (`ddiloco sim` drives the same core): classic synchronous
DiLoCo with bias correction, restarting and an outer lr scaled by M, against the outer step written
out by hand."""

import copy

import torch

from ddiloco.core import AlgorithmConfig
from ddiloco.sim.cluster import DecoupledCluster

from .helpers import FLAT_INNER, sim_config
from .test_exactness import adamw, assert_same_params, plain_step


def test_synchronous_diloco_with_every_outer_option_matches_the_step_written_out(tiny_task):
    learners, period, rounds, mu, k = 3, 4, 3, 0.5, 0.5
    config = sim_config(
        learners=learners,
        steps_per_learner=period * rounds,
        algorithm=AlgorithmConfig(
            fragments=1,
            sync_every=period,
            overlap=0,
            quorum=learners,
            merge="mean",
            outer_lr=0.7,
            outer_momentum=mu,
            final_momentum=True,
            outer_debias=True,
            outer_restart_every=2,
            outer_lr_per_learner=k,
        ),
    )
    cluster = DecoupledCluster(config, tiny_task)
    stats = cluster.run()
    assert stats["outer_steps"] == rounds and stats["contributions"] == rounds * learners
    assert cluster.sync.outer[0].steps == rounds

    global_model = tiny_task.build_model(config.seed)
    workers = [copy.deepcopy(global_model) for _ in range(learners)]
    opts = [adamw(w) for w in workers]
    streams = [tiny_task.stream(m, learners, FLAT_INNER.batch_size, config.seed) for m in range(learners)]
    lr = 0.7 * (1 + k * (learners - 1))  # M = 3 contributions in every round
    held = {1: 1, 2: 1, 3: 2}  # R = 2: the buffer restarts before step 2; the deltas it holds at step t
    buffers = {name: torch.zeros_like(p) for name, p in global_model.named_parameters()}
    for t in range(1, rounds + 1):
        for m in range(learners):
            for _ in range(period):
                plain_step(tiny_task, workers[m], opts[m], streams[m])
        with torch.no_grad():
            for (name, g), *local in zip(
                global_model.named_parameters(), *[w.parameters() for w in workers], strict=True
            ):
                delta = torch.stack([g - p for p in local]).mean(0)
                buf = buffers[name] = (0.0 if t % 2 == 0 else mu) * buffers[name] + delta
                g -= lr * (delta + mu / (1 - mu ** held[t]) * buf)
        for w in workers:
            w.load_state_dict(global_model.state_dict())
    assert_same_params(cluster.sync.params, global_model)
