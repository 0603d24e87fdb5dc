"""The learners' own end of a run (`core.finishing`): no budget, no Stop, each learner finishes its loop.

Issue #47: the final flush's rules engaged only on a budget or a Stop, so each last merge of a run
whose learners simply ended their loops took the whole outer momentum, and moved its fragment by
1.7-2.7 where the work of its tail moved it by 0.01-0.31. Every value below is worked by hand.
"""

import pytest
import torch

from ddiloco.core import AlgorithmConfig, SynchronizerCore, balanced_fragments

from .test_synchronizer import contribution, kinds


def make(learners=2, final_momentum=False):
    """Mean merge, K = 1, no grace, outer lr 0.5 and momentum 0.9: each contribution alone makes a
    version at once, unless the final flush gathers."""
    config = AlgorithmConfig(
        fragments=1,
        sync_every=4,
        overlap=2,
        quorum=1,
        grace=0.0,
        outer_lr=0.5,
        outer_momentum=0.9,
        merge="mean",
        ema=1.0,
        max_outer_norm_ratio=0.0,
        final_momentum=final_momentum,
    )
    core = SynchronizerCore(config, balanced_fragments([("w", 2)], 1), {"w": torch.zeros(2)})
    for m in range(learners):
        core.join(m, 0.0)
    return core


def merged(actions):
    return [a for a in actions if kinds([a]) == ["Merged"]]


def w(core):
    return core.params["w"]


def test_learners_that_finish_their_loops_end_the_run_as_a_budget_does_by_hand():
    core = make()
    # momentum built over the run: v1 buf = d = (-1, 0), w = -0.5 (d + 0.9 d) = (0.95, 0)
    assert merged(core.receive(contribution(0, [-1.0, 0.0], version=0), now=1.0))
    # v2 buf = 0.9 (-1, 0) + (-1, 0) = (-1.9, 0), w = (0.95, 0) + 0.5 (1 + 0.9 * 1.9, 0) = (2.305, 0)
    assert merged(core.receive(contribution(1, [-1.0, 0.0], version=1), now=2.0))
    assert torch.allclose(w(core), torch.tensor([2.305, 0.0]))
    # learner 0 ends its loop while learner 1 trains on: not the run's end yet...
    core.finishing(0, now=3.0)
    assert not core.final_flush
    # ...but its last work is a tail: a plain step lr * d, the momentum neither applied nor updated.
    # w = (2.305, 0) + 0.5 (0, 1) = (2.305, 0.5); with the momentum it would be (3.0745, 0.95).
    assert merged(core.receive(contribution(0, [0.0, -1.0], version=2), now=3.0))
    assert torch.allclose(w(core), torch.tensor([2.305, 0.5]))
    core.leave(0, now=3.5)
    assert not core.final_flush  # learner 1 still trains
    # learner 1's ordinary work takes the momentum as before: buf = 0.9 (-1.9, 0) + (-1, 0) = (-2.71, 0),
    # w = (2.305, 0.5) + 0.5 (1 + 0.9 * 2.71, 0) = (4.0245, 0.5)
    assert merged(core.receive(contribution(1, [-1.0, 0.0], version=3), now=4.0))
    assert torch.allclose(w(core), torch.tensor([4.0245, 0.5]))
    # the last learner ends its loop: the run's end, as a budget's. Its 1-step tail moves w by lr * d:
    # (4.0245, 0.5) + 0.5 (0, 0.2) = (4.0245, 0.6); with the momentum, by 0.5 (0.9 * 0.9 * 2.71, 0.2 + 0.9 * 0.2)
    core.finishing(1, now=5.0)
    assert core.final_flush
    assert merged(core.receive(contribution(1, [0.0, -0.2], steps=1, version=4), now=5.0))
    assert torch.allclose(w(core), torch.tensor([4.0245, 0.6]))
    assert torch.allclose(core.outer[0].buffers["w"], torch.tensor([-2.71, 0.0]))


def test_with_final_momentum_the_learners_end_keeps_the_momentum_by_hand():
    core = make(final_momentum=True)
    core.receive(contribution(0, [-1.0, 0.0], version=0), now=1.0)  # (0.95, 0), buf (-1, 0)
    core.finishing(0, now=2.0)
    core.leave(1, now=2.0)
    assert core.final_flush
    # buf = (-1.9, 0); w = (0.95, 0) + 0.5 (1 + 0.9 * 1.9, 0) = (2.305, 0): the flag puts it back
    core.receive(contribution(0, [-1.0, 0.0], version=1), now=2.0)
    assert torch.allclose(w(core), torch.tensor([2.305, 0.0]))


def test_once_every_live_learner_has_finished_the_flush_gathers_their_last_work_into_one_step_by_hand():
    core = make()
    core.learners_end.window = 3.0  # the driver's: its drain share
    core.finishing(1, now=1.0)
    assert not core.final_flush and core.flush_ends is None
    core.finishing(0, now=2.0)
    assert core.final_flush and core.flush_ends == 5.0
    # K = 1 and no grace would merge learner 0's last work alone at once; the flush waits for learner 1's:
    # two sync periods (2 * 4 * 0.5 s = 4 s from 2.0), cut at the flush's end, 5.0
    out = core.receive(contribution(0, [-1.0, 0.0], version=0, step_time=0.5), now=2.0)
    assert kinds(out) == ["FragmentRequest"] and out[0].learners == (1,)
    assert core.next_deadline() == 5.0
    out = core.receive(contribution(1, [0.0, -1.0], version=0, step_time=0.5), now=2.5)
    [m] = merged(out)
    assert sorted(a.learner for a in m.admitted) == [0, 1]
    # one plain step: mean = (-0.5, -0.5), w = 0.5 * (0.5, 0.5)
    assert torch.allclose(w(core), torch.tensor([0.25, 0.25]))
    assert core.outer[0].buffers == {}


def test_a_learner_that_comes_back_ends_the_learners_flush_but_never_a_budgets():
    core = make()
    core.finishing(0, now=1.0)
    core.finishing(1, now=1.0)
    assert core.final_flush
    core.join(0, now=2.0, restarted=False)  # the same finished process reconnecting: still the end
    assert core.final_flush
    core.join(2, now=3.0)  # a new learner: the run goes on
    assert not core.final_flush and core.flush_ends is None
    # the rule holds again once it finishes too
    core.finishing(2, now=4.0)
    assert core.final_flush
    core.join(1, now=5.0)  # learner 1 restarted: a new process trains anew, its finished mark is gone
    assert not core.final_flush and 1 not in core.learners_end.finished
    # learner 1's new work takes the momentum again: v1 w = -0.5 (d + 0.9 d) = (0.95, 0)
    core.receive(contribution(1, [-1.0, 0.0], version=0), now=6.0)
    assert torch.allclose(w(core), torch.tensor([0.95, 0.0]))
    core.begin_final_flush(ends=9.0)  # a budget's end
    core.join(3, now=7.0)
    assert core.final_flush and core.flush_ends == 9.0


@pytest.mark.parametrize("finished", [True, False])
def test_the_last_live_learner_leaving_ends_the_run_only_if_one_finished(finished):
    core = make()
    if finished:
        core.finishing(0, now=1.0)
    core.leave(1, now=2.0)  # declared gone: learner 0 is the last live one
    assert core.final_flush == finished
    core.leave(0, now=3.0)
    assert core.final_flush == finished  # all gone, none finished: a failure, not the run's end
