import pytest

from ddiloco.records.intervals import union_length
from ddiloco.sim.ledger import WorkLedger


def test_goodput_utilization_uptime_by_hand():
    ledger = WorkLedger(num_learners=2)
    for i in range(4):  # learner 0: steps [0,1) .. [3,4), 10 tokens each
        ledger.step(0, 0, float(i), float(i + 1), 10)
    ledger.step(1, 0, 0.0, 2.0, 10)  # learner 1: one slow step [0,2)
    ledger.reached_model(0, 0, last_step=3, steps=2, share=0.5)  # steps 2 and 3 count for half the model
    ledger.reached_model(0, 0, last_step=3, steps=1, share=0.5)  # step 3 also for the other half
    ledger.reached_model(1, 0, last_step=1, steps=1, share=0.25)
    s = ledger.summary(end_time=5.0)
    # useful = 0.5 (step 2) + 1.0 (step 3) + 2 * 0.25 = 2.0 over 2 learners * 5 s
    assert s["goodput"] == pytest.approx(2.0 / 10.0)
    assert s["utilization"] == pytest.approx(6.0 / 10.0)
    # union of [1,2), [2,3) and [0,2) = [0,3)
    assert s["uptime"] == pytest.approx(3.0 / 5.0)
    assert s["tokens_trained"] == 50
    assert s["tokens_merged"] == pytest.approx(5 + 10 + 2.5)


def test_work_merged_twice_is_an_error_not_a_silent_cap_and_bad_ranges_fail():
    ledger = WorkLedger(1)
    ledger.step(0, 0, 0.0, 1.0, 4)
    for _ in range(2):
        ledger.reached_model(0, 0, 1, 1, 0.5)
    assert ledger.summary(1.0)["goodput"] == pytest.approx(1.0)
    with pytest.raises(ValueError, match="double-merged"):
        ledger.reached_model(0, 0, 1, 1, 0.5)
    ledger.step(0, 0, 1.0, 2.0, 4)
    for share in (0.1, 0.2, 0.7):  # shares that add up to 1 only up to float rounding
        ledger.reached_model(0, 0, 2, 1, share)
    assert ledger.summary(2.0)["tokens_merged"] == pytest.approx(8.0)
    with pytest.raises(ValueError):
        ledger.reached_model(0, 0, last_step=2, steps=1, share=0.5)
    with pytest.raises(ValueError):
        ledger.reached_model(0, 1, last_step=1, steps=1, share=0.5)  # another incarnation
    with pytest.raises(ValueError):
        ledger.step(0, 0, 2.0, 1.0, 1)


def testunion_length():
    assert union_length([]) == 0.0
    assert union_length([(0, 1), (0.5, 2), (3, 4)]) == pytest.approx(3.0)


def test_work_merged_in_fragments_counts_whole_and_never_more_than_trained():
    """Shares of 1/P add up to 1 only up to float rounding; merged may not read above trained
    (CI saw 97344.00000000001)."""
    for fragments in (3, 7, 11):
        ledger = WorkLedger(2)
        for learner in range(2):
            for i in range(400):
                ledger.step(learner, 0, float(i), float(i + 1), 97 + i % 5)
            for _ in range(fragments):
                ledger.reached_model(learner, 0, last_step=400, steps=400, share=1.0 / fragments)
        s = ledger.summary(400.0)
        assert s["tokens_merged"] == s["tokens_trained"]
        assert s["goodput"] == pytest.approx(1.0)
