import itertools

import pytest
import torch

from ddiloco.core import (
    AlgorithmConfig,
    Contribution,
    Decline,
    RejectCode,
    SynchronizerCore,
    balanced_fragments,
)

_snapshots = itertools.count(1)  # a learner's step count only grows: each snapshot gets a new one


def contribution(learner, grad, steps=4, tokens=100, version=0, step_time=1.0, fragment=0, name="w"):
    return Contribution(
        learner,
        fragment,
        version,
        {name: torch.tensor(grad)},
        steps,
        tokens,
        float(steps),
        step_time,
        next(_snapshots),
    )


def make(quorum=2, grace=0.5, learners=3, merge="mean", momentum=0.0, max_ratio=0.0, late="merge", staleness=4):
    """The hand examples move a zero fragment by unit steps: the norm bound is off unless a test sets it."""
    config = AlgorithmConfig(
        fragments=1,
        sync_every=4,
        overlap=2,
        quorum=quorum,
        grace=grace,
        outer_lr=0.7,
        outer_momentum=momentum,
        merge=merge,
        ema=1.0,
        max_outer_norm_ratio=max_ratio,
        late=late,
        max_staleness=staleness,
    )
    plan = balanced_fragments([("w", 2)], 1)
    core = SynchronizerCore(config, plan, {"w": torch.zeros(2)})
    for m in range(learners):
        [update] = core.join(m, 0.0)
        assert update.version == 0 and update.learners == (m,)
    return core


def kinds(actions):
    return [type(a).__name__ for a in actions]


def test_quorum_then_grace_then_token_weighted_merge_by_hand():
    core = make(quorum=2)
    out = core.receive(contribution(0, [-1.0, 0.0], steps=4, tokens=100), now=0.0)
    assert kinds(out) == ["FragmentRequest"] and out[0].learners == (1, 2) and out[0].version == 0
    assert core.next_deadline() is None  # quorum of 2 not reached
    out = core.receive(contribution(1, [0.0, -2.0], steps=2, tokens=100), now=0.3)
    assert out == []
    # slack = 2 * 1.0 - (0.3 + 0) = 1.7; grace = 0.85 from the quorum at 0.3
    assert core.next_deadline() == pytest.approx(1.15)
    assert core.poll(1.0) == []
    out = core.poll(1.15)
    assert kinds(out) == ["Merged", "FragmentUpdate"]
    merged, update = out
    assert [w.learner for w in merged.admitted] == [0, 1]
    assert [w.weight for w in merged.admitted] == [2500.0, 5000.0]
    assert merged.quorum_time == pytest.approx(0.3) and merged.grace == pytest.approx(0.85)
    # delta = (2500*[-1,0] + 5000*[0,-2]) / 7500 = [-1/3, -4/3]; Theta = 0 - 0.7 * delta
    assert torch.allclose(update.tensors["w"], torch.tensor([0.7 / 3, 2.8 / 3]))
    assert update.version == 1 and update.learners == (0, 1, 2)
    assert core.versions[0] == 1 and core.rounds == {}
    # |delta| = sqrt(1/9 + 16/9) = sqrt(17)/3; contributions' norms 1 and 2, weighted 1:2 -> 5/3
    assert merged.merged_norm == pytest.approx(17**0.5 / 3)
    assert merged.contribution_norm == pytest.approx(5 / 3)


def test_rda_keeps_the_norm_that_a_plain_mean_of_orthogonal_updates_loses():
    norms = {}
    for merge in ("mean", "rda"):
        core = make(quorum=2, grace=0.0, learners=2, merge=merge)
        core.receive(contribution(0, [3.0, 0.0]), now=0.0)
        merged = core.receive(contribution(1, [0.0, 3.0]), now=0.1)[0]
        norms[merge] = merged.merged_norm / merged.contribution_norm
    assert norms["mean"] == pytest.approx(2**-0.5) and norms["rda"] == pytest.approx(1.0)


def test_merge_closes_early_when_everyone_asked_has_answered():
    core = make(quorum=1)
    core.receive(contribution(0, [1.0, 0.0]), now=0.0)
    assert core.next_deadline() == pytest.approx(1.0)  # K=1: quorum at once; grace 0.5 * 2
    assert core.receive(Decline(1, 0, 0, "nothing"), now=0.1) == []
    out = core.receive(contribution(2, [0.0, 1.0]), now=0.2)
    assert kinds(out) == ["Merged", "FragmentUpdate"]
    assert [w.learner for w in out[0].admitted] == [0, 2]


def test_no_grace_merges_the_quorum_alone():
    core = make(quorum=1, grace=0.0)
    out = core.receive(contribution(0, [1.0, 0.0]), now=0.0)
    assert kinds(out) == ["FragmentRequest", "Merged", "FragmentUpdate"]
    assert len(out[1].admitted) == 1


def test_a_learner_that_leaves_is_not_waited_for():
    core = make(quorum=3)
    core.receive(contribution(0, [1.0, 0.0]), now=0.0)
    core.receive(contribution(1, [1.0, 0.0]), now=0.1)
    assert core.next_deadline() is None
    out = core.leave(2, now=0.5)
    assert kinds(out) == ["Merged", "FragmentUpdate"]
    assert out[1].learners == (0, 1)  # the departed learner is not sent to


def test_quorum_is_capped_at_live_learners_so_k_equal_m_waits_for_every_live_one():
    core = make(quorum=10, learners=2)
    out = core.receive(contribution(0, [1.0, 0.0]), now=0.0)
    assert "Merged" not in kinds(out)
    out = core.receive(contribution(1, [1.0, 0.0]), now=2.0)
    assert kinds(out) == ["Merged", "FragmentUpdate"]


def test_rejoining_learner_gets_current_global_and_stale_work_is_refused():
    core = make(quorum=1, grace=0.0, learners=2, late="refuse")
    for v in range(3):
        core.receive(contribution(0, [-1.0, -1.0], version=v), now=float(v))
    assert core.versions[0] == 3
    current = core.params["w"].clone()
    [update] = core.join(1, now=5.0)
    assert update.version == 3 and torch.equal(update.tensors["w"], current)
    # work computed from version 0 must not drag the model back
    out = core.receive(contribution(1, [50.0, 50.0], version=0), now=5.1)
    assert kinds(out) == ["Rejected", "FragmentUpdate"]
    assert "stale" in out[0].reason and out[0].code is RejectCode.STALE
    assert out[1].version == 3 and out[1].learners == (1,)
    assert torch.equal(core.params["w"], current) and core.versions[0] == 3


def test_every_update_says_which_learners_made_its_version_and_a_restart_says_it_does_not_know():
    core = make(quorum=1, grace=0.0, learners=2, late="refuse")
    assert core.current_update(0, (0,)).merged == ()  # version 0: nobody's work
    *_, merged, update = core.receive(contribution(0, [-1.0, -1.0]), now=0.0)  # after its request to 1
    assert merged.version == 1 and update.merged == (0,) and update.learners == (0, 1)
    rejected, reply = core.receive(contribution(1, [1.0, 1.0]), now=0.1)  # too late for version 0's round
    assert "stale" in rejected.reason and reply.version == 1 and reply.merged == (0,)  # it was left out
    restored = make(quorum=1, grace=0.0, learners=2)
    restored.load_state_dict(core.state_dict())
    assert restored.current_update(0, (1,)).merged is None


@pytest.mark.parametrize(
    "message, reason, code",
    [
        (contribution(9, [1.0, 1.0]), "unknown learner", RejectCode.UNKNOWN_LEARNER),
        (contribution(0, [1.0, 1.0, 1.0]), "shape", RejectCode.BAD_TENSORS),
        (contribution(0, [float("nan"), 1.0]), "NaN or Inf", RejectCode.NON_FINITE),
        (contribution(0, [float("inf"), 1.0]), "NaN or Inf", RejectCode.NON_FINITE),
        (contribution(0, [1.0, 1.0], name="v"), "wrong tensors", RejectCode.BAD_TENSORS),
        (contribution(0, [1.0, 1.0], steps=0), "no steps", RejectCode.BAD_COUNTERS),
        (contribution(0, [1.0, 1.0], version=4), "unknown version", RejectCode.UNKNOWN_VERSION),
        (contribution(0, [1.0, 1.0], fragment=3), "not owned", RejectCode.NOT_OWNED),
    ],
)
def test_bad_contributions_are_rejected_and_change_nothing(message, reason, code):
    core = make(quorum=1)
    before = core.params["w"].clone()
    out = core.receive(message, now=0.0)
    assert kinds(out) == ["Rejected"] and reason in out[0].reason and out[0].code is code
    assert torch.equal(core.params["w"], before) and core.versions[0] == 0 and core.rounds == {}
    assert core.rejections == {code.value: 1}  # counted by code, whatever the reason's words


def test_duplicate_contribution_is_rejected():
    core = make(quorum=3)
    core.receive(contribution(0, [1.0, 0.0]), now=0.0)
    out = core.receive(contribution(0, [1.0, 0.0]), now=0.1)
    assert kinds(out) == ["Rejected"] and "duplicate" in out[0].reason and out[0].code is RejectCode.DUPLICATE
    assert len(core.rounds[0].contributions) == 1


def test_state_dict_round_trip_continues_identically():
    a = make(quorum=1, grace=0.0, momentum=0.9)
    a.receive(contribution(0, [-1.0, 0.5]), now=0.0)
    state = a.state_dict()
    b = make(quorum=1, grace=0.0, momentum=0.9)
    b.load_state_dict(state)
    for core in (a, b):
        core.receive(contribution(1, [0.3, -0.2], version=1), now=1.0)
    assert torch.equal(a.params["w"], b.params["w"]) and a.versions == b.versions == {0: 2}


def test_shards_own_disjoint_fragments():
    config = AlgorithmConfig(fragments=2, sync_every=4, overlap=1, quorum=1, grace=0.0)
    plan = balanced_fragments([("a", 3), ("b", 2)], 2)
    params = {"a": torch.zeros(3), "b": torch.zeros(2)}
    shard = SynchronizerCore(config, plan, params, owned=[1])
    assert set(shard.params) == {"b"}
    [update] = shard.join(0, 0.0)
    assert update.fragment == 1
    out = shard.receive(contribution(0, [1.0, 1.0, 1.0], name="a", fragment=0), now=0.0)
    assert "not owned" in out[0].reason
    with pytest.raises(ValueError):
        SynchronizerCore(config, plan, params, owned=[5])


def test_config_validation_names_every_problem():
    with pytest.raises(ValueError) as info:
        AlgorithmConfig(fragments=30, sync_every=24, overlap=24, quorum=0, grace=1.5)
    message = str(info.value)
    for word in ("fragments", "overlap", "quorum", "grace"):
        assert word in message


def test_open_rounds_say_why_no_quorum_formed():
    core = make(quorum=3)
    core.receive(contribution(0, [1.0, 0.0]), now=0.0)
    core.receive(Decline(2, 0, 0, "nothing"), now=0.5)
    [view] = core.open_rounds()
    # learner 2 has nothing for this version, so K=3 is capped at the two that can contribute
    assert (view.fragment, view.version, view.need) == (0, 0, 2)
    assert view.contributors == (0,) and view.declined == (2,) and view.waiting_for == (1,)
    text = view.describe(now=2.0)
    assert "no quorum after 2.00 s" in text and "waiting for [1]" in text and "need 2" in text
    out = core.receive(contribution(1, [1.0, 0.0]), now=2.0)
    assert (
        kinds(out) == ["Merged", "FragmentUpdate"] and core.open_rounds() == []
    )  # a declined learner never hangs a round


def test_fragment_state_and_current_update_are_copies():
    core = make(quorum=1, grace=0.0, momentum=0.9)
    core.receive(contribution(0, [-1.0, 0.5]), now=0.0)
    state = core.fragment_state(0)
    assert set(state) == {"w", "outer/w"}
    assert torch.equal(state["w"], core.params["w"]) and torch.equal(state["outer/w"], torch.tensor([-1.0, 0.5]))
    state["w"].add_(100.0)
    update = core.current_update(0, (1,))
    assert update.version == 1 and update.learners == (1,) and torch.equal(update.tensors["w"], core.params["w"])
    update.tensors["w"].add_(1.0)
    assert not torch.equal(update.tensors["w"], core.params["w"])
    with pytest.raises(KeyError):
        core.current_update(5, (1,))


def test_a_contribution_far_larger_than_its_fragment_is_refused():
    core = make(quorum=1, max_ratio=10.0)  # limit: 10 x max(|Theta| = 0, 0.1 * sqrt(2)) = 1.414
    [refused] = core.receive(contribution(0, [1.5, 0.0]), now=0.0)
    assert kinds([refused]) == ["Rejected"] and refused.reason.startswith("outer gradient too large")
    assert refused.code is RejectCode.TOO_LARGE
    assert core.rounds == {} and core.versions[0] == 0
    accepted = core.receive(contribution(1, [1.0, 0.0]), now=0.0)
    assert "Rejected" not in kinds(accepted)


def test_finite_contributions_that_overflow_are_not_merged():
    core = make(quorum=2, grace=0.0)
    huge = 3.0e38  # finite in fp32: one outer step of 0.7 * huge is finite, two overflow
    core.receive(contribution(0, [huge, huge]), now=0.0)
    core.receive(contribution(1, [huge, huge]), now=0.1)
    assert core.versions[0] == 1
    after_first = core.params["w"].clone()
    assert torch.isfinite(after_first).all()
    out = core.receive(contribution(0, [huge, huge], version=1), now=1.0)
    out += core.receive(contribution(1, [huge, huge], version=1), now=1.1)
    rejected = [a for a in out if kinds([a]) == ["Rejected"]]
    assert sorted(a.learner for a in rejected) == [0, 1] and "Merged" not in kinds(out)
    assert all("non-finite" in a.reason and a.code is RejectCode.MERGE_REFUSED for a in rejected)
    assert core.versions[0] == 1 and torch.equal(core.params["w"], after_first) and core.rounds == {}
    # the fragment keeps working: the next round merges normally
    core.receive(contribution(0, [-1.0, 0.0], version=1), now=2.0)
    out = core.receive(contribution(1, [-1.0, 0.0], version=1), now=2.1)
    assert "Merged" in kinds(out) and core.versions[0] == 2
    assert torch.isfinite(core.params["w"]).all()


def test_k1_without_grace_admits_every_contribution_queued_at_the_quorum_by_hand():
    core = make(quorum=1, grace=0.0)
    # three contributions reach the synchronizer at the same instant; the driver says more are queued
    out = core.receive(contribution(0, [-1.0, 0.0], tokens=100), now=1.0, hold=True)
    assert kinds(out) == ["FragmentRequest"]  # quorum K = 1 is met, but the merge waits for the queue
    assert core.receive(contribution(1, [0.0, -1.0], tokens=100), now=1.0, hold=True) == []
    out = core.receive(contribution(2, [-1.0, -1.0], tokens=200), now=1.0)  # the last one queued
    assert kinds(out) == ["Merged", "FragmentUpdate"]
    merged, update = out
    assert [w.learner for w in merged.admitted] == [0, 1, 2] and core.versions[0] == 1
    # weights tokens^2/steps: 2500, 2500, 10000 -> delta = (2500*[-1,0] + 2500*[0,-1] + 10000*[-1,-1]) / 15000
    delta = torch.tensor([-12500.0, -12500.0]) / 15000
    assert torch.allclose(update.tensors["w"], -0.7 * delta)
    # without hold the first one merges alone and the others are refused as stale (the paper's rule)
    core = make(quorum=1, grace=0.0, late="refuse")
    assert kinds(core.receive(contribution(0, [-1.0, 0.0]), now=1.0)) == ["FragmentRequest", "Merged", "FragmentUpdate"]
    assert kinds(core.receive(contribution(1, [0.0, -1.0]), now=1.0))[0] == "Rejected"


def test_a_held_round_merges_at_the_next_poll_when_nothing_else_comes():
    core = make(quorum=1, grace=0.0)
    core.receive(contribution(0, [-1.0, 0.0]), now=1.0, hold=True)
    assert core.next_deadline() == pytest.approx(1.0)
    assert kinds(core.poll(1.0)) == ["Merged", "FragmentUpdate"]


def test_a_held_round_waits_through_a_poll_or_a_leave_that_say_more_are_queued():
    core = make(quorum=1, grace=0.0)
    core.receive(contribution(0, [-1.0, 0.0]), now=1.0, hold=True)
    assert core.poll(1.0, hold=True) == []  # a timer fires while another contribution is queued
    core.join(5, now=1.0)
    assert core.leave(5, now=1.0, hold=True) == [] and 5 not in core.live
    out = core.receive(contribution(1, [0.0, -1.0]), now=1.0)  # the queued one arrives: both merge
    assert kinds(out) == ["Merged", "FragmentUpdate"] and [w.learner for w in out[0].admitted] == [0, 1]


def test_step_time_estimate_comes_from_the_learners_that_form_quorums_not_late_admissions():
    core = make(quorum=1, grace=0.5)  # ema = 1: the estimate is the last value that counted
    core.receive(contribution(0, [-1.0, 0.0], step_time=1.0), now=0.0)
    assert core.grace.step_time.get() == 1.0
    # slack = 2 * 1.0 - (0 + 0) = 2; grace 1.0: a slow learner (step time 10 s) is admitted in it
    out = core.receive(contribution(1, [0.0, -1.0], step_time=10.0), now=0.5)
    assert core.grace.step_time.get() == 1.0  # it did not stretch the next window
    out += core.poll(1.0)
    assert [w.learner for w in out[-2].admitted] == [0, 1]
    # the next round's window is still sized by the quorum's 1 s steps: 2 * 1 - 0 = 2, times 0.5
    core.receive(contribution(0, [-1.0, 0.0], step_time=1.0, version=1), now=5.0)
    assert core.next_deadline() == pytest.approx(6.0)


def test_the_learner_smooths_its_step_time_with_the_configured_ema():
    from ddiloco.core import FragmentUpdate, LearnerCore, Schedule

    plan = balanced_fragments([("w", 2)], 1)
    core = LearnerCore(0, {"w": torch.zeros(2)}, plan, Schedule(1, 2, 1), ema=1.0)
    core.join([FragmentUpdate(0, 0, {"w": torch.zeros(2)}, (0,))])
    [c] = core.after_step(1, 1.0)
    assert c.step_time == 1.0
    core.after_step(1, 3.0)
    assert core.step_time.get() == 3.0  # ema 1: the last step alone (the default 0.2 would give 1.4)


def test_without_final_momentum_the_final_flush_takes_a_plain_outer_step_by_hand():
    def run(final_momentum: bool) -> torch.Tensor:
        config = AlgorithmConfig(
            fragments=1,
            sync_every=4,
            overlap=2,
            quorum=1,
            grace=0.0,
            outer_lr=0.5,
            outer_momentum=0.9,
            ema=1.0,
            max_outer_norm_ratio=0.0,
            final_momentum=final_momentum,
        )
        core = SynchronizerCore(config, balanced_fragments([("w", 2)], 1), {"w": torch.zeros(2)})
        core.join(0, 0.0)
        core.receive(contribution(0, [-1.0, 0.0]), now=1.0)  # buf = d; Theta = 0 - 0.5 * (d + 0.9 d)
        core.begin_final_flush()
        core.receive(contribution(0, [-1.0, 0.0], version=1), now=2.0)
        return core.params["w"]

    # first step: -0.5 * 1.9 * (-1) = 0.95; with momentum: buf = 0.9 * -1 - 1 = -1.9, update -1 + 0.9 * -1.9
    assert torch.allclose(run(True), torch.tensor([0.95 + 0.5 * 2.71, 0.0]))
    assert torch.allclose(run(False), torch.tensor([0.95 + 0.5 * 1.0, 0.0]))  # lr * delta alone


def test_arrival_auto_rebases_only_where_rounds_average():
    """`arrival="auto"` (the default) keeps in-flight steps where a round averages several learners (a
    grace window, or K > 1) and overwrites with K = 1 and no grace, where each round merges its opener
    alone and re-based work would be summed learner after learner (docs/results.md, "Keeping the work")."""
    assert AlgorithmConfig().arrival == "auto" and AlgorithmConfig().rebases  # K = 1, grace 0.9
    assert not AlgorithmConfig(quorum=1, grace=0.0).rebases
    assert AlgorithmConfig(quorum=2, grace=0.0).rebases
    assert AlgorithmConfig(quorum=4, grace=0.0).rebases  # synchronous DiLoCo's K = M
    assert AlgorithmConfig(quorum=1, grace=0.0, arrival="rebase").rebases  # an explicit choice wins
    assert not AlgorithmConfig(quorum=4, grace=0.9, arrival="overwrite").rebases
    with pytest.raises(ValueError, match="arrival must be 'auto', 'overwrite' or 'rebase'"):
        AlgorithmConfig(arrival="sometimes")  # type: ignore[arg-type]


def test_a_detached_fragment_leaves_the_tensors_held_before_at_their_version_by_hand():
    """`detach_fragment` (a fetch sends the live tensors): what was held keeps version 0's values
    through the merge, and the merge steps the new storage exactly as it would have stepped the old."""
    core = make(quorum=2, grace=0.0, learners=2)
    held = core.params["w"]
    core.detach_fragment(0)
    assert core.params["w"] is not held and torch.equal(core.params["w"], held)
    core.receive(contribution(0, [-1.0, 0.0]), now=0.0)
    merged, update = core.receive(contribution(1, [0.0, -2.0]), now=0.1)
    # equal tokens and steps: delta = [-0.5, -1]; Theta = 0 - 0.7 * delta
    assert torch.equal(held, torch.zeros(2))  # version 0, untouched
    assert torch.allclose(core.params["w"], torch.tensor([0.35, 0.7])) and update.version == 1
    with pytest.raises(KeyError):
        core.detach_fragment(1)
