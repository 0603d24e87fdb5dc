import math

import pytest

from ddiloco.chaos.trace import FailureTrace, Outage, random_trace


def test_csv_round_trip_and_infinite_outage(tmp_path):
    trace = FailureTrace.of([Outage(5.0, 1, 9.0), Outage(2.0, 0, math.inf)])
    path = tmp_path / "trace.csv"
    trace.save(path)
    assert path.read_text().splitlines()[0] == "learner,down_at,up_at"
    again = FailureTrace.load(path)
    assert again == trace
    assert [o.learner for o in again.outages] == [0, 1]  # sorted by time


def test_overlapping_outages_of_one_learner_merge():
    trace = FailureTrace.of([Outage(1.0, 0, 5.0), Outage(4.0, 0, 7.0), Outage(8.0, 0, 9.0), Outage(2.0, 1, 3.0)])
    assert [(o.learner, o.down_at, o.up_at) for o in trace.outages] == [(0, 1.0, 7.0), (1, 2.0, 3.0), (0, 8.0, 9.0)]
    assert trace.downtime(0, horizon=8.5) == pytest.approx(6.5)
    assert trace.is_down(0, 6.9) and not trace.is_down(0, 7.0)


def test_scaling_and_selection():
    trace = FailureTrace.of([Outage(1.0, 0, 2.0), Outage(1.0, 3, 2.0)])
    assert trace.scaled(10).outages[0] == Outage(10.0, 0, 20.0)
    assert trace.for_learners(2).learners == {0}
    with pytest.raises(ValueError):
        trace.scaled(0)


def test_bad_files_name_the_line(tmp_path):
    path = tmp_path / "bad.csv"
    path.write_text("learner,down_at,up_at\n0,5,3\n")
    with pytest.raises(ValueError, match=":2:"):
        FailureTrace.load(path)
    path.write_text("who,when\n")
    with pytest.raises(ValueError, match="header"):
        FailureTrace.load(path)
    with pytest.raises(FileNotFoundError):
        FailureTrace.load(tmp_path / "missing.csv")


def test_random_trace_down_share_matches_its_parameters():
    trace = random_trace(num_learners=50, horizon=10_000.0, mean_time_between_failures=90.0, mean_downtime=10.0, seed=1)
    share = sum(trace.downtime(m, 10_000.0) for m in range(50)) / (50 * 10_000.0)
    assert share == pytest.approx(0.1, abs=0.01)
    assert random_trace(3, 100.0, 10.0, 1.0, seed=2) == random_trace(3, 100.0, 10.0, 1.0, seed=2)
