"""The synchronizer core's components on their own, without `SynchronizerCore`, by hand: the global
state (`sync_state`), the checks (`checks`) and the late work's desk (`late`)."""

import pytest
import torch

from ddiloco.core import AlgorithmConfig, balanced_fragments
from ddiloco.core.checks import ContributionChecks, measure
from ddiloco.core.late import LateRefusal, LateRounds
from ddiloco.core.messages import RejectCode
from ddiloco.core.round_sum import RoundSum
from ddiloco.core.rounds import Round
from ddiloco.core.sync_state import OUTER_PREFIX, SyncState
from ddiloco.core.timing import Ema

from .test_synchronizer import contribution

PLAN = balanced_fragments([("w", 2)], 1)


def config(**kw):
    defaults = dict(fragments=1, sync_every=4, overlap=2, outer_lr=0.5, outer_momentum=0.0, merge="mean")
    return AlgorithmConfig(**{**defaults, **kw})


def test_the_state_steps_gives_updates_out_and_restores_who_made_a_version_as_not_known():
    state = SyncState(config(), PLAN, [0], {"w": torch.tensor([3.0, 4.0])})
    state.step(0, {"w": (torch.tensor([-3.0, -4.0]), 1.0)}, use_momentum=True, learners=[2, 0, 2])
    assert torch.equal(state.params["w"], torch.tensor([4.5, 6.0]))  # (3, 4) - 0.5 * (-3, -4)
    assert state.versions == {0: 1} and state.merged_into == {0: (0, 2)}
    shared, copied = state.update(0, (1,), copy=False), state.update(0, (1,), copy=True)
    assert shared.tensors["w"] is state.params["w"] and copied.tensors["w"] is not state.params["w"]
    assert (copied.version, copied.learners, copied.merged) == (1, (1,), (0, 2))
    assert set(state.fragment_state(0)) == {"w"}  # no momentum: no buffer
    saved = state.state_dict()
    fresh = SyncState(config(), PLAN, [0], {"w": torch.zeros(2)})
    fresh.load_state_dict(saved)
    assert torch.equal(fresh.params["w"], torch.tensor([4.5, 6.0])) and fresh.versions == {0: 1}
    assert fresh.update(0, (1,), copy=True).merged is None  # who made it is not saved


def test_the_state_holds_outer_buffers_beside_the_tensors():
    state = SyncState(config(outer_momentum=0.5), PLAN, [0], {"w": torch.zeros(2)})
    state.step(0, {"w": (torch.tensor([1.0, 2.0]), 2.0)}, use_momentum=True, learners=[0])
    # buf = 2 * (1, 2) = (2, 4); w = 0 - 0.5 * ((2, 4) + 0.5 * (2, 4)) = (-1.5, -3)
    assert torch.equal(state.params["w"], torch.tensor([-1.5, -3.0]))
    assert torch.equal(state.fragment_state(0)[OUTER_PREFIX + "w"], torch.tensor([2.0, 4.0]))


def test_the_checks_read_the_state_and_bound_the_norm_by_the_current_version():
    state = SyncState(config(), PLAN, [0], {"w": torch.tensor([3.0, 4.0])})  # norm 5
    checks = ContributionChecks(config(max_outer_norm_ratio=2.0), state)
    big = contribution(0, [9.0, 12.0])  # norm 15
    assert checks.refusal(big, measure(big), live=()) == (
        RejectCode.UNKNOWN_LEARNER,
        "unknown learner 0: register (join) first",
    )
    too_large = checks.refusal(big, measure(big), live={0})  # 15 > 2 * 5
    assert too_large is not None and too_large.code == RejectCode.TOO_LARGE and "too large" in too_large.reason
    ok = contribution(0, [6.0, 8.0])
    assert checks.refusal(ok, measure(ok), live={0}) is None  # 10 <= 2 * 5
    state.step(0, {"w": (torch.tensor([-3.0, -4.0]), 1.0)}, use_momentum=True, learners=[0])  # w = (4.5, 6)
    assert checks.refusal(big, measure(big), live={0}) is None  # 15 <= 2 * 7.5: the new version's norm
    wrong = contribution(0, [1.0, 2.0, 3.0])
    assert checks.refusal(wrong, measure(wrong), live={0}) == (RejectCode.BAD_TENSORS, "w: shape (3,) != (2,)")


def test_late_work_goes_to_a_carry_is_refused_past_s_and_the_carry_comes_due_after_a_sync_period():
    step_time = Ema(1.0)
    step_time.update(0.5)
    late = LateRounds(config(max_staleness=2, staleness_discount=1.0), step_time, lambda p: RoundSum(frozenset(), None))
    c = contribution(0, [1.0, 0.0], version=0)  # 4 steps, 100 tokens: token weight 2500
    assert late.is_late(c, current=1, merging=False) and late.is_late(c, current=0, merging=True)
    assert not late.is_late(c, current=0, merging=False)
    assert late.admit(c, measure(c), now=2.0, current=1, merging=False, open_round=None) is None
    [work] = late.carries[0].work
    assert (work.staleness, work.weight, late.carries[0].since) == (1, 2500 / (1 + 1.0), 2.0)
    again = contribution(0, [1.0, 0.0], version=0)
    assert late.admit(again, measure(again), 2.1, 1, False, None) == LateRefusal(
        "duplicate contribution for this round", send_update=False, code=RejectCode.DUPLICATE
    )
    old = contribution(1, [1.0, 0.0], version=0)
    refusal = late.admit(old, measure(old), 2.2, current=3, merging=False, open_round=None)
    assert refusal is not None and refusal.send_update and "more than max_staleness S=2" in refusal.reason
    assert refusal.code == RejectCode.STALE
    # due at since + H * step time = 2 + 4 * 0.5; at once in the final flush; never while its fragment is busy
    assert late.deadlines(busy=set(), final_flush=False) == [4.0]
    assert late.deadlines(busy={0}, final_flush=False) == []
    assert late.deadlines(busy=set(), final_flush=True) == [2.0]
    assert late.pop_due(3.9, set(), False) == [] and late.pop_due(4.0, {0}, False) == []
    carry = late.carries[0]
    assert late.pop_due(4.0, set(), False) == [(0, carry)] and late.carries == {}


def test_late_work_joins_an_open_round_and_after_a_restart_older_work_is_refused():
    late = LateRounds(config(), Ema(1.0), lambda p: pytest.fail("no carry: a round is open"))
    r = Round(version=1, opened_at=0.0, expected={0, 1}, total=RoundSum(frozenset(), None))
    c = contribution(1, [0.0, 1.0], version=0)
    assert late.admit(c, measure(c), 0.5, current=1, merging=False, open_round=r) is None
    assert [w.contribution.learner for w in r.late] == [1] and late.carries == {}
    late.restart({0: 5})
    stale = contribution(1, [0.0, 1.0], version=4)
    refusal = late.admit(stale, measure(stale), 1.0, current=5, merging=False, open_round=None)
    assert refusal is not None and refusal.send_update and "before the synchronizer restarted" in refusal.reason


@pytest.mark.parametrize("base, current, merging, send_update", [(1, 1, True, False), (0, 1, False, True)])
def test_with_late_refuse_late_work_is_refused_and_an_out_of_date_learner_is_sent_the_fragment(
    base, current, merging, send_update
):
    late = LateRounds(config(late="refuse"), Ema(1.0), lambda p: RoundSum(frozenset(), None))
    c = contribution(0, [1.0, 0.0], version=base)
    refusal = late.admit(c, measure(c), 0.0, current, merging, open_round=None)
    assert refusal is not None and refusal.reason.startswith("stale") and refusal.send_update == send_update
    assert late.carries == {}
