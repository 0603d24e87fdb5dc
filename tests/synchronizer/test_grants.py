"""Token grants (`synchronizer.grants`): hand-computed grants, and a run of learners that take a step
only below their grant never trains past the budget by more than a step each, and always reaches it."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from ddiloco.synchronizer.grants import TokenGrants

HEARTBEAT = 0.5


def test_no_token_budget_grants_nothing():
    grants = TokenGrants(None)
    assert grants.grant("a", 1000, 1000, 1, 0.1, HEARTBEAT, {"a"}) is None and grants.allowed("a") is None


def test_before_its_first_step_a_learner_gets_no_lead_then_a_few_heartbeats_of_its_own_steps():
    grants = TokenGrants(100_000)
    assert grants.allowed("a") == 0  # its registration's reply: its first step needs no grant
    assert grants.grant("a", 0, 0, 0, 0.0, HEARTBEAT, {"a"}) == 0
    # one step of 1,000 tokens in 0.1 s: 3 heartbeats of 0.5 s are 15 steps ahead of its report
    assert grants.grant("a", 1000, 1000, 1, 0.1, HEARTBEAT, {"a"}) == 1000 + 15 * 1000
    # topped up to 15 steps ahead again, not added to
    assert grants.grant("a", 4000, 4000, 4, 0.1, HEARTBEAT, {"a"}) == 4000 + 15 * 1000
    assert grants.allowed("a") == 19_000


def test_slow_steps_still_lead_by_one_step():
    grants = TokenGrants(100_000)
    assert grants.grant("a", 2048, 2048, 1, 5.0, HEARTBEAT, {"a"}) == 2048 + 2048


def test_grants_never_add_up_past_the_budget_and_share_what_is_left():
    grants = TokenGrants(40_000)
    # a: 10,000 reported, 10 steps at 0.1 s -> wants 15,000 ahead; free 40,000 - 20,000 = 20,000 < 4 x 15,000
    # -> a quarter of the free tokens (at most a quarter, however few are live): 5,000
    assert grants.grant("a", 10_000, 20_000, 10, 0.1, HEARTBEAT, {"a", "b"}) == 15_000
    # b: free = 40,000 - 20,000 reported - a's lead 5,000 = 15,000 -> 3,750
    assert grants.grant("b", 10_000, 20_000, 10, 0.1, HEARTBEAT, {"a", "b"}) == 13_750
    # a reports 15,000 (its whole grant): free = 40,000 - 25,000 - b's lead 3,750 = 11,250 -> 2,812
    assert grants.grant("a", 15_000, 25_000, 15, 0.1, HEARTBEAT, {"a", "b"}) == 17_812
    assert 17_812 + 13_750 <= 40_000


def test_a_learner_alone_at_the_start_leaves_most_for_those_still_starting():
    grants = TokenGrants(10_240)
    # 128-token steps of 2 ms: 3 heartbeats ahead would be the whole budget; it gets a quarter of it
    assert grants.grant("a", 128, 128, 1, 0.002, 0.1, {"a"}) == 128 + (10_240 - 128) // 4


def test_a_fast_learner_asking_at_every_heartbeat_keeps_a_quarter_not_a_quarter_each_time():
    # Its grant is a share of what is left as its whole lead: asked again and again before the
    # other learner's first report, it must not take the rest a quarter at a time (the starved
    # second learner of a tiny Lightning run).
    grants = TokenGrants(10_240)
    first = grants.grant("a", 128, 128, 1, 0.002, 0.1, {"a"})
    for _ in range(20):
        assert grants.grant("a", 128, 128, 1, 0.002, 0.1, {"a", "b"}) == first
    # as it trains its grant, it may lead again by a quarter of what is then left
    assert grants.grant("a", first, first, 20, 0.002, 0.1, {"a", "b"}) == first + (10_240 - first) // 4
    # the second learner, after its first step, gets a quarter of what is neither reported nor a's lead
    pool = 10_240 - (first + 128) - (10_240 - first) // 4
    assert grants.grant("b", 128, first + 128, 1, 0.002, 0.1, {"a", "b"}) == 128 + pool // 4


def test_a_learner_no_longer_live_returns_its_lead():
    grants = TokenGrants(20_000)
    assert grants.grant("a", 1000, 1000, 1, 0.1, HEARTBEAT, {"a"}) == 1000 + 19_000 // 4
    # b while a is live: free = 20,000 - 2,000 - a's lead 4,750 = 13,250 -> 3,312
    assert grants.grant("b", 1000, 2000, 1, 0.1, HEARTBEAT, {"a", "b"}) == 1000 + 3312
    # a declared gone: b may lead by a quarter of 20,000 - 3,000 reported (a's 4,750 back) = 4,250
    # (with a still live: a quarter of 17,000 - 4,750 = 3,062)
    assert grants.grant("b", 2000, 3000, 2, 0.1, HEARTBEAT, {"b"}) == 2000 + 4250
    assert grants.allowed("a") == 0


@settings(max_examples=100, deadline=None)
@given(
    budget=st.integers(1, 100_000),
    learners=st.lists(
        st.tuples(st.integers(256, 4096), st.floats(0.01, 2.0), st.floats(0.05, 1.0)),  # tokens/step, s/step, s/beat
        min_size=1,
        max_size=6,
    ),
)
def test_learners_below_their_grants_stop_within_a_step_each_of_the_budget_and_reach_it(budget, learners):
    """Learners on their own clocks: each takes a step only while its count is below its grant (its
    first step excepted) and heartbeats on its own period; the synchronizer's count is what they
    reported. They end within one step each past the budget, and never stall short of it."""
    grants = TokenGrants(budget)
    names = [f"l{i}" for i in range(len(learners))]
    tokens = [0] * len(learners)
    steps = [0] * len(learners)
    reported = [0] * len(learners)
    allowed = [0] * len(learners)
    next_step = [size[1] for size in learners]
    next_beat = [size[2] for size in learners]
    now = 0.0
    for _ in range(100_000):  # at most 400 steps per learner, 40 heartbeats per step
        if sum(reported) >= budget:  # the synchronizer stops the run
            break
        i, at, is_beat = min(
            [(k, next_step[k], False) for k in range(len(learners))]
            + [(k, next_beat[k], True) for k in range(len(learners))],
            key=lambda e: e[1],
        )
        now = at
        step_tokens, step_seconds, beat_seconds = learners[i]
        if is_beat:
            reported[i] = tokens[i]
            got = grants.grant(names[i], tokens[i], sum(reported), steps[i], step_seconds, beat_seconds, set(names))
            assert got is not None
            allowed[i] = got
            next_beat[i] = now + beat_seconds
        else:
            if steps[i] == 0 or tokens[i] < allowed[i]:
                tokens[i] += step_tokens
                steps[i] += 1
            next_step[i] = now + step_seconds
    else:
        raise AssertionError(f"the run never reached its budget: {sum(reported)} of {budget}")
    assert sum(tokens) <= max(budget, sum(s for s, _, _ in learners)) + sum(s for s, _, _ in learners)
