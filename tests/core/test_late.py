"""Late work (`core.late`): merged once into a later round, discounted by staleness, refused past S."""

import pytest
import torch

from ddiloco.core import AlgorithmConfig, RejectCode, SynchronizerCore, balanced_fragments
from ddiloco.core.messages import Decline

from .test_synchronizer import contribution, kinds


def make(quorum=1, learners=2, late="merge", staleness=4, discount=0.0, defer=False, sync_every=4):
    """Mean merge, no momentum, lr 0.7, H = 4, no grace: each step below is worked by hand."""
    config = AlgorithmConfig(
        fragments=1,
        sync_every=sync_every,
        overlap=2,
        quorum=quorum,
        grace=0.0,
        outer_lr=0.7,
        outer_momentum=0.0,
        merge="mean",
        ema=1.0,
        max_outer_norm_ratio=0.0,
        late=late,
        max_staleness=staleness,
        staleness_discount=discount,
    )
    core = SynchronizerCore(config, balanced_fragments([("w", 2)], 1), {"w": torch.zeros(2)}, defer_merges=defer)
    for m in range(learners):
        core.join(m, 0.0)
    return core


@pytest.mark.parametrize("discount, expected", [(0.0, [1.05, 1.05]), (1.0, [0.7 + 0.7 * 2 / 3, 0.7 * 4 / 3])])
def test_work_that_missed_its_round_is_merged_once_into_the_next_by_hand(discount, expected):
    core = make(discount=discount)
    # learner 0 alone makes version 1: w = 0 - 0.7 * (-1, 0) = (0.7, 0)
    assert kinds(core.receive(contribution(0, [-1.0, 0.0]), now=0.0))[-2:] == ["Merged", "FragmentUpdate"]
    # learner 1's work against version 0 arrives after that merge: kept, nothing sent back, nothing merged yet
    assert core.receive(contribution(1, [0.0, -2.0], version=0), now=0.1) == []
    assert core.versions[0] == 1 and torch.allclose(core.params["w"], torch.tensor([0.7, 0.0]))
    # the next round takes it with weight 2500 / (1 + discount * 1) beside learner 0's 2500:
    # discount 0: mean((-1, -1), (0, -2)) = (-0.5, -1.5), w = (0.7, 0) + 0.7 * (0.5, 1.5) = (1.05, 1.05)
    # discount 1: (2500 (-1, -1) + 1250 (0, -2)) / 3750 = (-2/3, -4/3)
    out = core.receive(contribution(0, [-1.0, -1.0], version=1), now=1.0)
    merged = next(a for a in out if kinds([a]) == ["Merged"])
    assert [(w.learner, w.base_version) for w in merged.admitted] == [(0, 1), (1, 0)]
    assert [w.weight for w in merged.admitted] == [2500.0, 2500.0 / (1 + discount)]
    assert torch.allclose(core.params["w"], torch.tensor(expected))
    assert core.carries == {} and core.versions[0] == 2
    # counted once: the next merge admits only what is sent for it
    out = core.receive(contribution(0, [-1.0, 0.0], version=2), now=2.0)
    merged = next(a for a in out if kinds([a]) == ["Merged"])
    assert [w.learner for w in merged.admitted] == [0]


def test_late_work_joins_the_round_that_is_open_beside_the_same_learners_on_time_work():
    core = make(quorum=2)
    core.receive(contribution(0, [-1.0, 0.0]), now=0.0)
    core.receive(contribution(1, [-1.0, 0.0]), now=0.1)  # quorum 2: version 1
    core.receive(contribution(0, [0.0, -1.0], version=1), now=1.0)  # opens version 1's round
    assert core.receive(contribution(0, [0.0, -1.0], version=0), now=1.1) == []  # late: joins it
    assert core.rounds[0].late[0].contribution.learner == 0 and 0 not in core.carries
    assert core.open_rounds()[0].late == (0,) and core.open_rounds()[0].need == 2  # not counted for K
    out = core.receive(contribution(1, [0.0, -1.0], version=1), now=1.2)
    merged = next(a for a in out if kinds([a]) == ["Merged"])
    assert sorted((w.learner, w.base_version) for w in merged.admitted) == [(0, 0), (0, 1), (1, 1)]


def test_work_more_than_s_versions_late_is_refused_and_the_learner_gets_the_current_value():
    core = make(staleness=2)
    for v in range(3):
        core.receive(contribution(0, [-1.0, 0.0], version=v), now=float(v))
    assert core.versions[0] == 3
    out = core.receive(contribution(1, [5.0, 5.0], version=0), now=3.1)  # 3 versions late
    assert kinds(out) == ["Rejected", "FragmentUpdate"] and out[1].version == 3
    assert "3 versions late" in out[0].reason and "max_staleness S=2" in out[0].reason
    assert core.carries == {}
    assert core.receive(contribution(1, [0.0, -1.0], version=1), now=3.2) == []  # 2 late: kept
    assert [w.staleness for w in core.carries[0].work] == [2]
    dup = core.receive(contribution(1, [0.0, -1.0], version=1), now=3.3)
    assert kinds(dup) == ["Rejected"] and "duplicate" in dup[0].reason


def test_a_carry_no_round_takes_is_merged_alone_after_one_sync_period():
    core = make()
    core.receive(contribution(0, [-1.0, 0.0], step_time=0.5), now=0.0)  # version 1
    assert core.receive(contribution(1, [0.0, -1.0], version=0), now=0.2) == []
    due = 0.2 + 4 * 0.5  # H steps at the smoothed step time (ema 1: the last one seen)
    assert core.next_deadline() == pytest.approx(due)
    assert core.poll(due - 0.01) == []
    out = core.poll(due)
    assert kinds(out) == ["Merged", "FragmentUpdate"] and out[1].learners == (0, 1)
    assert [(w.learner, w.base_version) for w in out[0].admitted] == [(1, 0)]
    assert torch.allclose(core.params["w"], torch.tensor([0.7, 0.7])) and core.versions[0] == 2
    assert core.next_deadline() is None


@pytest.mark.parametrize("late", ["merge", "refuse"])
def test_work_sent_while_its_version_is_being_merged_waits_for_the_next_round_or_is_refused(late):
    core = make(defer=True, late=late)
    [due] = [a for a in core.receive(contribution(0, [-1.0, 0.0]), now=0.0) if kinds([a]) == ["MergeDue"]]
    out = core.receive(contribution(1, [0.0, -1.0]), now=0.1)  # against version 0, whose merge is computing
    if late == "merge":
        assert out == [] and core.carries[0].work[0].staleness == 1  # one version late once it is applied
    else:
        assert kinds(out) == ["Rejected"] and "being merged" in out[0].reason and core.carries == {}
        assert out[0].code is RejectCode.STALE
    core.finish_merge(due.job, due.job.compute(), now=0.2)
    assert core.versions[0] == 1 and core.rounds == {}


def test_refuse_mode_drops_late_work_and_resets_the_learner():
    core = make(late="refuse")
    core.receive(contribution(0, [-1.0, 0.0]), now=0.0)
    out = core.receive(contribution(1, [0.0, -2.0], version=0), now=0.1)
    assert kinds(out) == ["Rejected", "FragmentUpdate"] and "stale" in out[0].reason
    assert out[0].code is RejectCode.STALE and core.carries == {}


def test_late_config_is_validated():
    with pytest.raises(ValueError, match="late must be"):
        AlgorithmConfig(late="keep")
    with pytest.raises(ValueError, match="max_staleness"):
        AlgorithmConfig(max_staleness=0)
    with pytest.raises(ValueError, match="staleness_discount"):
        AlgorithmConfig(staleness_discount=-1.0)


def test_in_the_final_flush_late_work_gathers_every_live_learner_into_one_outer_step_by_hand():
    """A real 100 ms link spread the learners' last work over seconds and each piece was merged on its
    own: one full outer step per learner. Now the last work of all is merged together."""
    core = make(learners=3)
    core.receive(contribution(0, [-1.0, 0.0], step_time=0.5), now=0.0)  # K = 1: version 1, w = (0.7, 0)
    core.begin_final_flush()
    # learner 1's last work, against version 0, opens a gathering round that asks the others
    out = core.receive(contribution(1, [0.0, -1.0], version=0, step_time=0.5), now=0.2)
    assert kinds(out) == ["FragmentRequest"] and out[0].learners == (0, 2) and out[0].version == 1
    # it waits for everyone, at most two sync periods: 0.2 + 2 * H 4 * 0.5 s = 4.2
    assert core.next_deadline() == pytest.approx(4.2)
    assert core.poll(1.0) == []
    assert core.receive(Decline(2, 0, 1, "no steps since the last update"), now=1.1) == []
    out = core.receive(contribution(0, [-1.0, -1.0], version=1, step_time=0.5), now=1.2)
    merged = next(a for a in out if kinds([a]) == ["Merged"])
    assert sorted(w.learner for w in merged.admitted) == [0, 1]
    # one step: mean((0, -1), (-1, -1)) = (-0.5, -1); w = (0.7, 0) + 0.7 * (0.5, 1) = (1.05, 0.7)
    assert torch.allclose(core.params["w"], torch.tensor([1.05, 0.7]))
    assert core.versions[0] == 2 and core.carries == {} and core.rounds == {}


def test_in_the_final_flush_an_on_time_round_waits_for_late_last_work_and_a_silent_learner_only_so_long():
    core = make(learners=3)
    core.receive(contribution(0, [-1.0, 0.0], step_time=0.5), now=0.0)  # version 1
    core.begin_final_flush()
    out = core.receive(contribution(0, [-1.0, -1.0], version=1, step_time=0.5), now=0.5)
    assert kinds(out) == ["FragmentRequest"] and out[0].learners == (1, 2)
    assert core.next_deadline() == pytest.approx(0.5 + 4.0)  # no grace (gamma 0), but the gathering
    assert core.receive(contribution(1, [0.0, -1.0], version=0, step_time=0.5), now=0.6) == []  # late: joins
    assert core.poll(4.4) == []  # learner 2 is live and silent
    merged = next(a for a in core.poll(4.5) if kinds([a]) == ["Merged"])
    assert sorted(w.learner for w in merged.admitted) == [0, 1]
    assert torch.allclose(core.params["w"], torch.tensor([1.05, 0.7]))


def test_before_the_final_flush_a_carry_still_merges_alone_after_a_sync_period():
    core = make(learners=3)
    core.receive(contribution(0, [-1.0, 0.0], step_time=0.5), now=0.0)
    assert core.receive(contribution(1, [0.0, -1.0], version=0, step_time=0.5), now=0.2) == []
    assert core.next_deadline() == pytest.approx(0.2 + 4 * 0.5)  # CARRY_PERIODS = 1 sync period
    assert kinds(core.poll(2.2)) == ["Merged", "FragmentUpdate"] and core.carries == {}


def test_late_work_from_before_a_restart_is_refused_while_work_on_the_restored_version_is_admitted():
    # version 2 is made and checkpointed; the synchronizer restarts from it and so forgets which
    # snapshots it already merged: work based on version 1 (1 version late, within S = 4) may have been
    # merged before the restart, so it is refused with the current value; work on version 2 is on time
    before = make()
    for v in range(2):
        before.receive(contribution(0, [-1.0, 0.0], version=v), now=float(v))
    assert before.versions[0] == 2
    core = make()
    core.load_state_dict(before.state_dict())
    assert core.versions[0] == 2 and torch.allclose(core.params["w"], torch.tensor([1.4, 0.0]))
    out = core.receive(contribution(1, [0.0, -1.0], version=1), now=2.1)
    assert kinds(out) == ["Rejected", "FragmentUpdate"] and out[1].version == 2
    assert "before the synchronizer restarted" in out[0].reason
    assert core.carries == {} and core.rounds.get(0) is None
    # on the restored version: merged (K = 1), w = (1.4, 0) - 0.7 * (0, -1) = (1.4, 0.7)
    out = core.receive(contribution(1, [0.0, -1.0], version=2), now=2.2)
    assert kinds(out)[-2:] == ["Merged", "FragmentUpdate"]
    assert torch.allclose(core.params["w"], torch.tensor([1.4, 0.7]))
    # work that is late only after the restart is merged as late work again (the floor is version 2)
    assert core.receive(contribution(0, [-1.0, 0.0], version=2), now=2.3) == []


def test_the_final_flush_gathers_no_longer_than_its_end_the_drain_by_hand():
    """#46: at H = 24 and 0.3 s steps the gathering window is 2 * 24 * 0.3 = 14.4 s, past a 12 s
    drain; a round still open at the drain was abandoned, its accepted work never merged. With the
    flush's end at 9 s the round that opens at 0.5 s merges at 9 s, not at 14.9 s."""
    core = make(learners=3, sync_every=24)
    core.receive(contribution(0, [-1.0, 0.0], step_time=0.3), now=0.0)  # K = 1: version 1, w = (0.7, 0)
    core.begin_final_flush(ends=9.0)
    out = core.receive(contribution(0, [-1.0, -1.0], version=1, step_time=0.3), now=0.5)
    assert kinds(out) == ["FragmentRequest"] and out[0].learners == (1, 2)  # it gathers the others
    assert core.next_deadline() == pytest.approx(9.0)  # min(0.5 + 14.4, 9.0)
    assert core.poll(8.9) == []  # learners 1 and 2 are live and silent
    merged = next(a for a in core.poll(9.0) if kinds([a]) == ["Merged"])
    assert [w.learner for w in merged.admitted] == [0]
    assert torch.allclose(core.params["w"], torch.tensor([1.4, 0.7]))  # (0.7, 0) + 0.7 * (1, 1)
    assert core.rounds == {} and core.versions[0] == 2


def test_with_k_above_one_the_final_flush_sets_its_deadline_without_waiting_for_a_quorum_by_hand():
    """#46: with K = 2 a final-flush round with one contribution had no deadline until a quorum that
    may never come (the others live but silent); its gathering window now runs from its opening:
    0.5 + 2 * H 4 * 0.5 s = 4.5, and it merges what it has then."""
    core = make(quorum=2, learners=3)
    core.begin_final_flush()
    out = core.receive(contribution(0, [-1.0, -1.0], step_time=0.5), now=0.5)
    assert kinds(out) == ["FragmentRequest"] and out[0].learners == (1, 2)
    assert core.next_deadline() == pytest.approx(4.5)
    assert core.poll(4.4) == []
    merged = next(a for a in core.poll(4.5) if kinds([a]) == ["Merged"])
    assert [w.learner for w in merged.admitted] == [0]
    assert torch.allclose(core.params["w"], torch.tensor([0.7, 0.7]))
    # and a flush end before that wins: the same round, ending at 2.0
    core = make(quorum=2, learners=3)
    core.begin_final_flush(ends=2.0)
    core.receive(contribution(0, [-1.0, -1.0], step_time=0.5), now=0.5)
    assert core.next_deadline() == pytest.approx(2.0)
    assert kinds(core.poll(2.0))[0] == "Merged"
