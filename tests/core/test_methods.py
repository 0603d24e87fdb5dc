"""What each method changes (`core.methods`) and Streaming DiLoCo's wait rule (`core.learner`),
against hand-computed values."""

from dataclasses import replace

import pytest
import torch

from ddiloco.core import (
    AlgorithmConfig,
    Decline,
    FragmentRequest,
    FragmentUpdate,
    LearnerCore,
    Schedule,
    balanced_fragments,
)
from ddiloco.core.learner import overdue
from ddiloco.core.methods import METHODS, algorithm_for, default_merge, fixed_knobs

ASKED = AlgorithmConfig(fragments=4, sync_every=8, overlap=2, quorum=1, grace=0.5, outer_lr=0.3, merge="rda")


def test_the_table_of_what_each_method_changes():
    assert algorithm_for("decoupled", ASKED, learners=3) == ASKED
    assert algorithm_for("diloco", ASKED, learners=3) == replace(
        ASKED, fragments=1, overlap=0, quorum=3, synchronous=True
    )
    # Streaming DiLoCo: the user's fragments and overlap, every learner in every round, no grace, waits
    assert algorithm_for("streaming", ASKED, learners=3) == replace(ASKED, quorum=3, grace=0.0, synchronous=True)
    for data_parallel in ("ddp", "elastic-ddp"):
        assert algorithm_for(data_parallel, ASKED, learners=3) == ASKED
    assert not ASKED.synchronous  # decoupled's learners never wait on a merge (tau > 0)
    assert [default_merge(m) for m in ("decoupled", "streaming", "diloco")] == ["rda", "mean", "mean"]
    assert set(METHODS) == {"ddp", "elastic-ddp", "diloco", "streaming", "decoupled"}
    with pytest.raises(ValueError, match="unknown method 'magic'"):
        fixed_knobs("magic", 3)
    with pytest.raises(ValueError, match="learners"):
        algorithm_for("streaming", ASKED, learners=0)


def test_the_wait_rule_by_hand():
    # fragment sent after step 3 with tau = 2: steps 4 and 5 overlap its sync, step 6 needs its value
    assert [overdue(step, sent_at=3, overlap=2) for step in (4, 5, 6, 7)] == [False, False, True, True]
    # tau = 0 (synchronous DiLoCo): the very next step waits
    assert overdue(4, sent_at=3, overlap=0)


def make(synchronous: bool, overlap: int = 1) -> LearnerCore:
    params = {"a": torch.zeros(4), "b": torch.zeros(2)}
    plan = balanced_fragments([("a", 4), ("b", 2)], 2)  # a -> fragment 0, b -> fragment 1
    core = LearnerCore(7, params, plan, Schedule(2, 4, overlap), synchronous=synchronous)
    core.join([FragmentUpdate(0, 0, {"a": torch.ones(4)}, (7,)), FragmentUpdate(1, 0, {"b": torch.ones(2)}, (7,))])
    return core


def test_a_streaming_learner_waits_only_once_a_fragment_is_more_than_tau_steps_overdue():
    core, free = make(synchronous=True), make(synchronous=False)
    for _ in range(2):
        assert core.after_step(10, 0.1) == [] and free.after_step(10, 0.1) == []
    # fragment 0 (offset 0) is due at step 0 + 4 - tau = 3
    assert [m.fragment for m in core.after_step(10, 0.1)] == [0] and core.step == 3
    free.after_step(10, 0.1)
    assert not core.must_wait()  # step 4 is the one step (tau = 1) that overlaps the sync
    core.after_step(10, 0.1)
    free.after_step(10, 0.1)
    assert core.must_wait()  # step 5 would be 2 steps past it: wait for the merged value
    assert not free.must_wait()  # decoupled never waits (tau > 0)
    core.receive(FragmentUpdate(0, 1, {"a": torch.full((4,), 2.0)}, (7,)))
    assert core.apply_arrivals() == [0] and not core.must_wait()


def test_a_streaming_learner_sends_on_its_own_schedule_not_when_pulled():
    # A pull answered early would cut the outer step short of H inner steps: every learner in a
    # round brings the same H (as synchronous DiLoCo's learners do); decoupled answers pulls.
    core, free = make(synchronous=True), make(synchronous=False)
    for c in (core, free):
        c.after_step(10, 0.1)
        c.request(FragmentRequest(1, 0, (7,)))
    assert core.collect() == []
    assert [m.fragment for m in free.collect()] == [1]


def test_a_waiting_streaming_learner_answers_the_request_that_would_otherwise_deadlock_the_rounds():
    # Learner 7 sent fragment 0 at step 3 and, after step 4, waits for its merge. The round of fragment 1
    # waits for learner 7, while the other learner that fragment 0's round needs waits for fragment 1
    # (a learner that joined mid-round, steps out of phase): learner 7 answers the pull for fragment 1
    # with its 4 steps so far, instead of on its own schedule after the wait, which would never end.
    core = make(synchronous=True)
    for _ in range(3):
        core.after_step(10, 0.1)
    core.request(FragmentRequest(1, 0, (7,)))
    assert not core.must_wait() and core.collect() == []  # not waiting: its own schedule, as above
    core.after_step(10, 0.1)
    core.request(FragmentRequest(1, 0, (7,)))
    assert core.must_wait()
    [sent] = core.collect()
    assert (sent.fragment, sent.base_version, sent.steps) == (1, 0, 4)
    core.request(FragmentRequest(0, 0, (7,)))  # the fragment it waits on: its work is in that round
    assert core.collect() == []
    core.request(FragmentRequest(0, 1, (7,)))  # a later round of it: declined, an update is in flight
    [declined] = core.collect()
    assert isinstance(declined, Decline) and declined.fragment == 0
