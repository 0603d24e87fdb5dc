from ddiloco.core import AdmittedWork, Merged, balanced_fragments
from ddiloco.synchronizer.ledger import MergeLedger, PendingWork


def merged(fragment, version, *work):
    return Merged(fragment, version, 0.0, 0.0, 0.0, 0.0, tuple(AdmittedWork(*w, 1.0) for w in work), 2)


def test_merge_books_tokens_and_seconds_by_fragment_share():
    plan = balanced_fragments([("a", 3), ("b", 1)], 2)  # shares 0.75 and 0.25
    ledger = MergeLedger(plan, started_wall=100.0)
    ledger.on_join(100.5)  # stalls count from the first join, as in the run's summary (start-up is no stall)
    ledger.on_join(101.0)
    ledger.contributed(0, 0, 0, PendingWork(position=4, incarnation="x", span_start=100.0, snapshot_wall=101.0))
    ledger.contributed(1, 0, 0, PendingWork(position=3, incarnation="y", span_start=100.0, snapshot_wall=101.0))
    records = ledger.on_merge(merged(0, 1, (0, 4, 4, 40, 2.0), (1, 3, 3, 30, 1.5)), wall=102.0)
    assert ledger.tokens_merged == 0.75 * 70 and ledger.useful_seconds == 0.75 * 3.5
    assert [r["position"] for r in records] == [4, 3]
    assert ledger.books[0].merged_position == 4 and ledger.stall_max == 1.5
    assert ledger.stall(now_wall=105.0) == 3.0
    assert ledger.resume_position(0, []) == 4 and ledger.resume_position(0, [9]) == 9


def test_a_step_merged_twice_for_the_same_fragment_is_counted():
    ledger = MergeLedger(balanced_fragments([("a", 1)], 1), 0.0)
    ledger.contributed(0, 0, 0, PendingWork(10, "x", 0.0, 1.0))
    ledger.on_merge(merged(0, 1, (0, 10, 10, 100, 1.0)), 1.0)
    ledger.contributed(0, 0, 1, PendingWork(12, "y", 0.0, 2.0))  # claims steps 3..12: 8 already merged
    ledger.on_merge(merged(0, 2, (0, 10, 10, 100, 1.0)), 2.0)
    assert ledger.double_merged_steps == 8


def test_state_round_trip():
    ledger = MergeLedger(balanced_fragments([("a", 1)], 1), 5.0)
    ledger.report_tokens(2, "inc", 640)
    ledger.on_rejected(2)
    ledger.on_join(7.0)
    again = MergeLedger(ledger.plan, 0.0)
    again.load_state_dict(ledger.state_dict())
    assert again.tokens_reported == 640 and again.rejected == 1 and again.started_wall == 5.0
    assert again.first_join_wall == 7.0 and MergeLedger(ledger.plan, 0.0).stall(99.0) == 0.0
