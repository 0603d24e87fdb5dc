import pytest
import torch

from ddiloco.core import (
    Contribution,
    Decline,
    FragmentRequest,
    FragmentUpdate,
    LearnerCore,
    Schedule,
    balanced_fragments,
)


def make(overlap=1, period=4):
    params = {"a": torch.zeros(4), "b": torch.zeros(2)}
    plan = balanced_fragments([("a", 4), ("b", 2)], 2)  # a -> fragment 0, b -> fragment 1
    core = LearnerCore(7, params, plan, Schedule(2, period, overlap))
    core.join(
        [
            FragmentUpdate(0, 0, {"a": torch.full((4,), 1.0)}, (7,)),
            FragmentUpdate(1, 0, {"b": torch.full((2,), 2.0)}, (7,)),
        ]
    )
    return core, params


def test_join_overwrites_and_zeroes_counters():
    core, params = make()
    assert torch.equal(params["a"], torch.ones(4)) and torch.equal(params["b"], torch.full((2,), 2.0))
    assert core.versions == [0, 0]
    assert all(c.steps == 0 and c.tokens == 0 for c in core.counters)
    with pytest.raises(ValueError):
        core.join([FragmentUpdate(0, 0, {"a": torch.ones(4)}, (7,))])


def test_step_before_join_is_an_error():
    params = {"a": torch.zeros(1)}
    core = LearnerCore(0, params, balanced_fragments([("a", 1)], 1), Schedule(1, 2, 1))
    with pytest.raises(RuntimeError, match="join"):
        core.after_step(1, 1.0)


def test_counters_due_steps_and_outer_gradient_sign():
    core, params = make(overlap=1, period=4)
    sent = {}
    for step in range(1, 7):
        params["a"] += 0.5  # "training" moves a up by 0.5 per step
        for msg in core.after_step(tokens=10, seconds=0.25):
            sent.setdefault(msg.fragment, []).append((step, msg))
    # fragment 0: offset 0, first due at 0 + 4 - 1 = 3; fragment 1: offset 2, due at 2 + 4 - 1 = 5
    assert [s for s, _ in sent[0]] == [3]
    assert [s for s, _ in sent[1]] == [5]
    c0 = sent[0][0][1]
    assert isinstance(c0, Contribution)
    assert (c0.steps, c0.tokens, c0.seconds, c0.base_version, c0.step) == (3, 30, 0.75, 0, 3)
    # a went from 1.0 to 2.5: v = Theta - theta = -1.5
    assert torch.allclose(c0.outer_gradient["a"], torch.full((4,), -1.5))
    assert core.pending == [0, 0]
    # pending: nothing more is sent for fragment 0 however long we wait
    for _ in range(10):
        assert all(m.fragment != 0 for m in core.after_step(10, 0.25))


def test_arrival_overwrites_at_boundary_resets_counters_and_keeps_inner_optimizer_state():
    core, params = make(overlap=1, period=4)
    weights = torch.nn.Parameter(params["a"])  # share storage with the model parameter
    params["a"] = weights
    core.params = params
    opt = torch.optim.AdamW([weights], lr=0.1)
    for _ in range(3):
        weights.grad = torch.ones(4)
        opt.step()
        core.after_step(10, 1.0)
    exp_avg = opt.state[weights]["exp_avg"].clone()
    core.receive(FragmentUpdate(0, 1, {"a": torch.full((4,), 9.0)}, (7,)))
    assert not torch.equal(weights.detach(), torch.full((4,), 9.0))  # not before the boundary
    weights.grad = torch.ones(4)
    opt.step()
    core.after_step(10, 1.0)
    assert torch.equal(weights.detach(), torch.full((4,), 9.0))
    assert core.versions[0] == 1 and core.counters[0].steps == 0 and core.pending[0] is None
    assert core.counters[1].steps == 4  # the other fragment keeps counting
    assert torch.allclose(opt.state[weights]["exp_avg"], 0.9 * exp_avg + 0.1 * torch.ones(4))


def test_old_versions_are_ignored():
    core, params = make()
    core.receive(FragmentUpdate(0, 3, {"a": torch.full((4,), 3.0)}, (7,)))
    core.receive(FragmentUpdate(0, 2, {"a": torch.full((4,), 2.0)}, (7,)))
    core.after_step(1, 1.0)
    assert core.versions[0] == 3 and torch.equal(params["a"], torch.full((4,), 3.0))
    core.receive(FragmentUpdate(0, 1, {"a": torch.full((4,), 1.0)}, (7,)))
    core.after_step(1, 1.0)
    assert core.versions[0] == 3


def test_requests_answered_at_boundary_or_declined():
    core, params = make(overlap=1, period=8)
    core.request(FragmentRequest(1, 0, (7,)))
    out = core.after_step(5, 1.0)
    assert len(out) == 1 and isinstance(out[0], Contribution) and out[0].fragment == 1 and out[0].steps == 1
    core.request(FragmentRequest(0, 4, (7,)))  # a version we do not hold
    out = core.after_step(5, 1.0)
    assert isinstance(out[0], Decline) and "holds version 0" in out[0].reason
    core.request(FragmentRequest(0, 0, (3,)))  # addressed to someone else
    assert core.requested == {}


def test_fresh_learner_declines_until_it_has_stepped():
    core, params = make(overlap=1, period=8)
    core.receive(FragmentUpdate(0, 1, {"a": torch.zeros(4)}, (7,)))
    core.after_step(5, 1.0)  # applies version 1: counters reset to zero
    core.request(FragmentRequest(0, 1, (7,)))
    assert isinstance(core.collect()[0], Decline)


def test_blocking_mode_waits_and_ignores_requests():
    core, params = make(overlap=0, period=2)
    assert not core.answer_requests
    assert core.after_step(1, 1.0) == []
    out = core.after_step(1, 1.0)
    assert [m.fragment for m in out] == [0]  # offset 0: due at 0 + 2 - 0
    assert core.must_wait()
    core.request(FragmentRequest(1, 0, (7,)))
    assert core.collect() == []
    core.receive(FragmentUpdate(0, 1, {"a": torch.zeros(4)}, (7,)))
    assert core.apply_arrivals() == [0]
    assert not core.must_wait()


def test_flush_sends_all_unsent_work():
    core, _ = make(overlap=1, period=8)
    core.after_step(3, 1.0)
    out = core.flush()
    assert sorted(m.fragment for m in out) == [0, 1]
    assert core.flush() == []  # all pending now


def test_a_stopped_blocking_learner_declines_requests_it_cannot_answer():
    core, _ = make(overlap=0, period=2)
    core.after_step(1, 1.0)
    core.after_step(1, 1.0)  # fragment 0 sent (due), fragment 1 holds one unsent step
    core.receive(FragmentUpdate(1, 1, {"b": torch.zeros(2)}, (7,)))
    core.receive(FragmentUpdate(0, 1, {"a": torch.zeros(4)}, (7,)))
    core.apply_arrivals()  # both came back: nothing left to send
    core.request(FragmentRequest(0, 1, (7,)))  # another learner's final flush opened a round for all
    [decline] = core.flush()
    assert isinstance(decline, Decline) and (decline.fragment, decline.version) == (0, 1)
    core.request(FragmentRequest(1, 1, (7,)))  # a request after the flush is declined too
    [late] = core.collect()
    assert isinstance(late, Decline) and late.fragment == 1
    # while training, a blocking learner still ignores requests (its own schedule decides)
    core, _ = make(overlap=0, period=2)
    core.request(FragmentRequest(1, 0, (7,)))
    assert core.collect() == []


def test_force_reapplies_a_held_version_and_retry_resends_lost_work():
    core, params = make(overlap=1, period=4)
    for _ in range(3):
        params["a"] += 1.0
        out = core.after_step(10, 1.0)
    assert [m.fragment for m in out] == [0] and core.pending[0] == 0
    # the synchronizer lost it: retry makes fragment 0 due again, with the work done since included
    assert not core.retry(0, version=5)
    assert core.retry(0, version=0)
    params["a"] += 1.0
    out = core.after_step(10, 1.0)
    assert [m.fragment for m in out] == [0] and out[0].steps == 4
    assert torch.allclose(out[0].outer_gradient["a"], torch.full((4,), -4.0))
    # a forced update of the version we already hold is applied anyway (a plain receive ignores it)
    core.receive(FragmentUpdate(0, 0, {"a": torch.zeros(4)}, (7,)))
    assert 0 not in core.inbox
    core.force(FragmentUpdate(0, 0, {"a": torch.zeros(4)}, (7,)))
    core.after_step(10, 1.0)
    assert torch.equal(params["a"], torch.zeros(4)) and core.pending[0] is None and core.counters[0].steps == 0


def test_due_names_exactly_what_collect_snapshots_and_consumes_nothing():
    core, params = make(overlap=1, period=4)
    for step in range(1, 9):
        if step == 2:
            core.request(FragmentRequest(1, 0, (7,)))  # answered at once: due before its schedule
        applied = core.begin_step(10, 0.25)
        assert applied == []
        due, requested = core.due(), dict(core.requested)
        assert core.due() == due and core.requested == requested  # asking twice changes nothing
        sent = [m.fragment for m in core.collect() if isinstance(m, Contribution)]
        assert sent == due
        if step == 2:
            assert due == [1]
        if step == 3:
            assert due == [0]


def test_base_copy_lives_on_the_base_device_in_fp32():
    params = {"a": torch.zeros(3, dtype=torch.bfloat16)}
    core = LearnerCore(0, params, balanced_fragments([("a", 3)], 1), Schedule(1, 2, 1), base_device="meta")
    core.join([FragmentUpdate(0, 0, {"a": torch.ones(3)}, (0,))])
    assert core.base[0]["a"].device.type == "meta" and core.base[0]["a"].dtype == torch.float32
    assert params["a"].dtype == torch.bfloat16 and torch.equal(params["a"], torch.ones(3, dtype=torch.bfloat16))


def rebasing(rebase: bool, late_merged: bool = True):
    params = {"a": torch.zeros(2)}
    core = LearnerCore(
        0, params, balanced_fragments([("a", 2)], 1), Schedule(1, 2, 1), rebase=rebase, late_merged=late_merged
    )
    core.join([FragmentUpdate(0, 0, {"a": torch.tensor([1.0, 1.0])}, (0,))])
    return core, params


def test_rebase_keeps_the_steps_taken_since_the_snapshot_by_hand():
    for rebase, expected, steps in ((False, [2.0, 2.0], 0), (True, [2.0, 2.3], 2)):
        core, params = rebasing(rebase)
        params["a"] += torch.tensor([0.1, 0.0])  # one inner step
        [c] = core.after_step(1, 1.0)  # snapshot at theta = [1.1, 1.0]: v = [-0.1, 0]
        assert torch.allclose(c.outer_gradient["a"], torch.tensor([-0.1, 0.0]))
        params["a"] += torch.tensor([0.0, 0.2])
        assert core.after_step(1, 1.0) == []  # in flight
        core.receive(FragmentUpdate(0, 1, {"a": torch.tensor([2.0, 2.0])}, (0,)))
        params["a"] += torch.tensor([0.0, 0.1])  # the step during which the update arrives
        core.begin_step(1, 1.0)
        # overwrite: theta = Theta_new; rebase: Theta_new + (theta - theta_at_snapshot) = 2 + [0, 0.3]
        assert torch.allclose(params["a"], torch.tensor(expected)), rebase
        assert core.counters[0].steps == steps and core.versions == [1] and core.pending == [None]
        assert torch.equal(core.base[0]["a"], torch.tensor([2.0, 2.0]))


def test_rebase_keeps_a_snapshot_the_merge_left_out_and_sends_it_with_the_next_contribution_by_hand():
    # late work refused: the update's `merged` says who made version 1: us, someone else (ours was
    # stale), or not known. Late work merged: the snapshot is on its way whatever `merged` says.
    cases = [(False, (0,), [2.0, 2.3], 2), (False, (1,), [2.1, 2.3], 3), (False, None, [2.0, 2.3], 2)]
    cases += [(True, (1,), [2.0, 2.3], 2)]
    for late_merged, merged, expected, steps in cases:
        core, params = rebasing(True, late_merged)
        params["a"] += torch.tensor([0.1, 0.0])
        [c] = core.after_step(10, 1.0)  # snapshot at [1.1, 1.0] against version 0 (Theta_0 = [1, 1])
        params["a"] += torch.tensor([0.0, 0.2])
        assert core.after_step(10, 1.0) == []
        core.receive(FragmentUpdate(0, 1, {"a": torch.tensor([2.0, 2.0])}, (0,), merged))
        params["a"] += torch.tensor([0.0, 0.1])
        core.begin_step(10, 1.0)
        # taken (or not known): Theta_1 + (theta - theta_at_snapshot); left out: Theta_1 + (theta - Theta_0)
        assert torch.allclose(params["a"], torch.tensor(expected)), merged
        assert core.counters[0].steps == steps and core.counters[0].tokens == 10 * steps
        [again] = core.collect()  # due again (H = 2 steps after the snapshot): against version 1
        assert again.base_version == 1 and again.steps == steps and again.tokens == 10 * steps
        # the outer gradient is Theta_1 - theta: everything not yet merged, the refused step included
        assert torch.allclose(again.outer_gradient["a"], torch.tensor([2.0, 2.0]) - torch.tensor(expected))


def test_a_learner_slower_than_the_rounds_still_sends_its_rebased_work_on_its_own_cadence_by_hand():
    """H = 4, tau = 1: a learner that never contributed is aligned with the others' cadence by an
    update (as if it had sent tau steps ago), so its next send is due H - tau steps later. Where its
    unsent work is kept (re-based), an update that arrives every 3 of its steps (the others twice as
    fast) would put its clock back each time: it never sent, and the work piled up for the final
    flush (a 90-step contribution in a run; the loss rose by 0.05-0.16 when it was merged). Its clock
    now runs on while it holds re-based work."""
    for rebase in (False, True):
        params = {"a": torch.zeros(2)}
        core = LearnerCore(0, params, balanced_fragments([("a", 2)], 1), Schedule(1, 4, 1), rebase=rebase)
        core.join([FragmentUpdate(0, 0, {"a": torch.tensor([1.0, 1.0])}, (0,))])
        sent, version = [], 0
        for step in range(1, 13):
            params["a"] += 0.1
            if step % 3 == 0:  # the others' merge of this fragment, before our send is due
                version += 1
                core.receive(FragmentUpdate(0, version, {"a": torch.full((2,), 1.0 + version)}, (1,)))
            sent += [(step, m.steps) for m in core.after_step(1, 1.0) if isinstance(m, Contribution)]
        if rebase:  # first due at step 3 (offset 0, tau 1), then every 4: at most H steps of work each
            assert sent == [(3, 3), (7, 4), (11, 4)] and core.counters[0].steps == 1
        else:  # overwritten at steps 3, 6, 9 and 12, its work dropped each time (the paper's rule): the
            # alignment puts its next send H - tau = 3 steps after each, and the next update comes first
            assert sent == [] and core.counters[0].steps == 0


def test_overwrite_loses_a_snapshot_the_merge_left_out_as_the_paper_does():
    core, params = rebasing(False)
    params["a"] += torch.tensor([0.1, 0.0])
    core.after_step(10, 1.0)
    core.receive(FragmentUpdate(0, 1, {"a": torch.tensor([2.0, 2.0])}, (0,), (1,)))
    core.begin_step(10, 1.0)
    assert torch.equal(params["a"], torch.tensor([2.0, 2.0])) and core.counters[0].steps == 0


def test_rebase_without_a_pending_snapshot_keeps_all_unsent_work_and_repairs_still_overwrite():
    core, params = rebasing(True)
    core.answer_requests = False
    params["a"] += torch.tensor([0.5, 0.0])
    core.pending[0] = None
    core.counters[0].add(1, 1.0)
    core.inbox[0] = FragmentUpdate(0, 1, {"a": torch.tensor([3.0, 3.0])}, (0,))
    core.apply_arrivals()
    assert torch.allclose(params["a"], torch.tensor([3.5, 3.0]))  # Theta_new + (theta - Theta_old)
    assert core.counters[0].steps == 1  # the work is still ours to send
    core.force(FragmentUpdate(0, 1, {"a": torch.tensor([3.0, 3.0])}, (0,)))
    core.apply_arrivals()
    assert torch.equal(params["a"], torch.tensor([3.0, 3.0])) and core.counters[0].steps == 0


def test_acknowledge_ends_a_leaving_learners_pending_work_without_values():
    core, params = make(overlap=1, period=8)
    core.after_step(3, 1.0)
    with torch.no_grad():
        params["a"].add_(0.5)  # trained: a = 1.5
    with pytest.raises(RuntimeError, match="flush"):
        core.acknowledge(0, 1)  # a training learner applies updates, it is not told about them
    [c0, c1] = core.flush()
    assert (c0.fragment, c0.base_version, c0.tokens) == (0, 0, 3)
    assert torch.equal(c0.outer_gradient["a"], torch.full((4,), -0.5))  # Theta - theta = 1 - 1.5
    assert not core.acknowledge(0, 0)  # not newer than the version it was sent against
    assert core.pending == [0, 0]
    assert core.acknowledge(0, 1)
    assert core.pending == [None, 0]
    assert not core.acknowledge(0, 2)  # nothing awaited any more
    assert core.versions == [0, 0]  # no value was taken: the parameters stay the trained ones
    assert torch.equal(params["a"], torch.full((4,), 1.5))
    assert core.counters[0].steps == 0 and core.counters[1].steps == 1
    assert core.flush() == []  # the acknowledged work is not sent again; fragment 1 is still in flight
    assert core.acknowledge(1, 3)  # merged into a later version (other learners' rounds came first)
    assert core.pending == [None, None] and core.flush() == []


def test_tokens_sent_and_overwritten_are_counted_once_by_hand():
    for rebase, overwritten in ((False, 20.0), (True, 0.0)):
        core, params = rebasing(rebase)
        core.after_step(10, 1.0)  # snapshot: 10 tokens sent
        assert core.tokens_sent == 10.0 and core.tokens_overwritten == 0.0
        core.begin_step(10, 1.0)
        core.begin_step(10, 1.0)  # 20 tokens trained since the snapshot
        core.receive(FragmentUpdate(0, 1, {"a": torch.tensor([2.0, 2.0])}, (0,), (0,)))
        core.begin_step(0, 1.0)
        assert core.tokens_overwritten == overwritten, rebase  # overwrite loses what was not sent
        assert core.tokens_sent == 10.0
    core, params = rebasing(False)
    core.after_step(10, 1.0)
    assert core.retry(0, 0) and core.tokens_sent == 0.0  # refused or lost: it goes again, counted then
    [again] = core.after_step(10, 1.0)
    assert again.tokens == 20 and core.tokens_sent == 20.0
