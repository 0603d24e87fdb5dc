"""No learner's work is taken twice (`core.taken`), with late work merged, by hand."""

import dataclasses

import pytest
import torch

from ddiloco.core import RejectCode

from .test_late import make
from .test_synchronizer import contribution, kinds


def test_the_same_snapshot_sent_again_after_its_merge_is_refused_not_merged_twice():
    # a push whose reply was lost is sent again (over gRPC): by then its work was merged, and late
    # merging would otherwise take it a second time
    core = make()
    first = contribution(1, [0.0, -1.0], steps=4)
    core.receive(first, now=0.0)
    assert core.versions[0] == 1
    again = core.receive(first, now=0.5)  # the same snapshot, now one version late
    assert kinds(again) == ["Rejected"] and "taken already" in again[0].reason and core.carries == {}
    assert again[0].code is RejectCode.DUPLICATE


def test_a_later_snapshot_on_the_same_version_repeats_the_merged_one_and_is_refused():
    # the learner reconnected and retried: its next snapshot is still against version 0, so its outer
    # gradient holds the merged snapshot's 4 steps plus 2 more. Taking it would count those 4 twice.
    core = make()
    first = contribution(1, [0.0, -1.0], steps=4)
    core.receive(first, now=0.0)
    assert torch.allclose(core.params["w"], torch.tensor([0.0, 0.7]))  # 0 - 0.7 * (0, -1)
    repeat = dataclasses.replace(contribution(1, [0.0, -1.5], steps=6), step=first.step + 2)
    out = core.receive(repeat, now=0.5)
    assert kinds(out) == ["Rejected"] and "repeats its steps" in out[0].reason and out[0].code is RejectCode.DUPLICATE
    assert core.carries == {} and core.rounds == {}
    core.poll(10.0)
    assert torch.allclose(core.params["w"], torch.tensor([0.0, 0.7])) and core.versions[0] == 1


def test_a_later_snapshot_on_the_same_version_is_refused_while_the_first_is_being_merged():
    core = make(defer=True)
    first = contribution(1, [0.0, -1.0])
    [due] = [a for a in core.receive(first, now=0.0) if kinds([a]) == ["MergeDue"]]
    assert core.holding(1) == {0: 0} and core.holding(0) == {}  # its work is in the merge in progress
    repeat = dataclasses.replace(contribution(1, [0.0, -1.5], steps=6), step=first.step + 2)
    out = core.receive(repeat, now=0.1)
    assert kinds(out) == ["Rejected"] and core.carries == {}
    core.finish_merge(due.job, due.job.compute(), now=0.2)
    assert core.holding(1) == {}


def test_late_work_on_a_newer_version_from_the_same_learner_is_still_taken():
    # after its merge the learner holds version 1: its next snapshot (one version late when it arrives)
    # is new work and is merged once
    core = make()
    core.receive(contribution(1, [0.0, -1.0]), now=0.0)
    core.receive(contribution(0, [-1.0, 0.0], version=1), now=0.1)  # version 2
    late = contribution(1, [0.0, -1.0], version=1)
    assert core.receive(late, now=0.2) == [] and core.carries[0].work[0].contribution.step == late.step
    assert core.holding(1) == {0: 1}


def test_a_restarted_learner_counts_its_steps_anew_a_reconnecting_one_does_not():
    core = make()
    first = contribution(1, [0.0, -1.0])
    core.receive(first, now=0.0)
    core.join(1, now=1.0, restarted=False)  # the same process, a new connection
    assert kinds(core.receive(first, now=1.1)) == ["Rejected"]
    core.join(1, now=2.0)  # a new process: its step count starts again
    fresh = dataclasses.replace(contribution(1, [0.0, -1.0], version=1), step=1)
    assert "Merged" in kinds(core.receive(fresh, now=2.1))


def test_a_refused_merge_gives_the_work_back_so_the_learner_may_send_it_again():
    core = make()
    bad = contribution(1, [float("nan"), 0.0])
    out = core.receive(bad, now=0.0)
    assert "Rejected" in kinds(out) and core.versions[0] == 0
    again = dataclasses.replace(contribution(1, [0.0, -1.0], steps=6), step=bad.step + 2)
    assert "Merged" in kinds(core.receive(again, now=0.1))


@pytest.mark.parametrize("late", ["merge", "refuse"])
def test_taken_work_is_forgotten_at_a_synchronizer_restore(late):
    core = make(late=late)
    first = contribution(1, [0.0, -1.0])
    core.receive(first, now=0.0)
    state = core.state_dict()
    core.load_state_dict(state)
    assert core.taken.newest == {}
