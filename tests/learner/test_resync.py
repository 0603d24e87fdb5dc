"""After registering again: which pending work a learner sends again (`joining.resync`)."""

import torch

from ddiloco.learner.joining import resync

from ..core.test_learner import make


def sent_fragment_0(core, params):
    for _ in range(3):
        params["a"] += 1.0
        out = core.after_step(10, 1.0)
    assert [m.fragment for m in out] == [0] and core.pending[0] == 0


def test_work_the_shard_still_holds_is_not_sent_again():
    # the shard holds our fragment-0 work in a round (or a merge in progress): sending it again would
    # repeat it (the shard refuses that: core/taken.py), so the learner waits for the merge
    core, params = make(overlap=1, period=4)
    sent_fragment_0(core, params)
    force: dict[int, int] = {}
    resync(core, shard=0, versions={0: 0, 1: 0}, force=force, holding={0: 0})
    assert core.pending[0] == 0 and force == {}


def test_work_the_shard_lost_is_sent_again_with_what_was_trained_since():
    core, params = make(overlap=1, period=4)
    sent_fragment_0(core, params)
    resync(core, shard=0, versions={0: 0, 1: 0}, force={}, holding={})
    assert core.pending[0] is None
    params["a"] += 1.0
    out = core.after_step(10, 1.0)
    assert [m.fragment for m in out] == [0] and out[0].steps == 4
    assert torch.allclose(out[0].outer_gradient["a"], torch.full((4,), -4.0))


def test_a_synchronizer_without_the_holding_field_gets_the_work_again():
    core, params = make(overlap=1, period=4)
    sent_fragment_0(core, params)
    resync(core, shard=0, versions={0: 0, 1: 0}, force={})
    assert core.pending[0] is None
