"""HeLoCo's stale-work correction in the simulator (`ddiloco sim` drives the same core): behind a slow
link, with K = 1 and no grace, answers to a round's requests arrive after it merged and are merged late;
with `stale_correction` on, the core corrects exactly that late work against the fragment's momentum.
(At outer lr 0.7 and momentum 0.5 every late tensor of this run agreed with the momentum, cosines
0.15 to 0.97, and nothing was changed; at lr 3 and momentum 0.9 a few oppose it.)"""

from __future__ import annotations

import torch

from ddiloco.core import AlgorithmConfig
from ddiloco.core import late as late_module
from ddiloco.sim.cluster import DecoupledCluster
from ddiloco.sim.hardware import LinkModel, StepTimeModel

from .helpers import sim_config


def run(tiny_task, monkeypatch, stale_correction: bool):
    calls: list[int] = []  # per call: the tensors it changed

    def spy(values, norms, momentum):
        out, out_norms = correct_stale(values, norms, momentum)
        calls.append(sum(out[name] is not values[name] for name in values))
        return out, out_norms

    correct_stale = late_module.correct_stale
    monkeypatch.setattr(late_module, "correct_stale", spy)
    algorithm = AlgorithmConfig(
        fragments=2,
        sync_every=8,
        overlap=2,
        quorum=1,
        grace=0.0,
        outer_lr=3.0,  # an outer step that overshoots: some late work then opposes the momentum
        outer_momentum=0.9,
        max_outer_norm_ratio=0.0,
        arrival="rebase",
        late="merge",
        stale_correction=stale_correction,
    )
    config = sim_config(
        learners=4,
        steps_per_learner=24,
        algorithm=algorithm,
        steps=StepTimeModel(speeds=(1.0, 1.0, 1.2, 1.2), jitter=0.1),
        link=LinkModel(latency=0.3, bandwidth=1e15, merge_rate=1e15),
    )
    cluster = DecoupledCluster(config, tiny_task)
    stats = cluster.run()
    monkeypatch.undo()
    assert cluster.sync.config.stale_correction is stale_correction  # what the core runs
    return cluster, stats, calls


def test_the_option_reaches_the_core_and_changes_only_late_work(tiny_task, monkeypatch):
    on, on_stats, on_calls = run(tiny_task, monkeypatch, True)
    off, off_stats, off_calls = run(tiny_task, monkeypatch, False)
    assert off_calls == []  # off: never called
    # on: called on late work (none refused here), and some of its tensors opposed the momentum
    assert on_stats["rejected_contributions"] == 0
    assert len(on_calls) > 0 and sum(on_calls) > 0, on_calls
    assert any(not torch.equal(on.sync.params[n], off.sync.params[n]) for n in on.sync.params)
