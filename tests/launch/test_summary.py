import json

import pytest

from ddiloco.launch.summary import summarize
from ddiloco.learner.journal import Journal


def write_events(path, events):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(e) + "\n" for e in events))


def test_goodput_uptime_and_stall_from_merge_records(tmp_path):
    work = lambda m, seconds, tokens, share, a, b: {  # noqa: E731
        "learner": m, "steps": 2, "tokens": tokens, "seconds": seconds, "share": share, "span_start": a,
        "snapshot_wall": b}
    write_events(tmp_path / "sync-0" / "events.jsonl", [
        {"t": 100.0, "kind": "join", "learner": 0},
        {"t": 101.0, "kind": "join", "learner": 1},
        {"t": 104.0, "kind": "merge", "fragment": 0, "admitted": [work(0, 2.0, 100, 0.5, 100.0, 104.0)]},
        {"t": 107.0, "kind": "merge", "fragment": 1, "admitted": [work(1, 4.0, 60, 0.5, 103.0, 107.0),
                                                                  work(0, 2.0, 40, 0.5, 105.0, 107.0)]},
        {"t": 108.0, "kind": "rejected", "learner": 1},
        {"t": 110.0, "kind": "stop"},
        {"t": 111.0, "kind": "merge", "fragment": 0, "admitted": []},
    ])
    j = Journal(tmp_path / "learner-0" / "journal-a.json")
    j.write({"tokens": 300, "seconds": 8.0})
    j.close()
    s = summarize([tmp_path / "sync-0"], [tmp_path / "learner-0"], learners=2, end_wall=120.0, fallback_start=0.0)
    assert s["sim_seconds"] == 10.0  # first join to the stop
    assert s["goodput"] == pytest.approx((2.0 + 4.0 + 2.0) * 0.5 / 20.0)
    assert s["uptime"] == pytest.approx(7.0 / 10.0)  # [100, 107] covered by merged work
    assert s["stall_seconds_max"] == pytest.approx(4.0)  # 100 -> 104 (and 107 -> 110 is 3)
    assert s["tokens_merged"] == pytest.approx(100.0)
    assert s["tokens_trained"] == 300 and s["utilization"] == pytest.approx(8.0 / 20.0)
    assert s["outer_steps"] == 3 and s["contributions"] == 3 and s["rejected_contributions"] == 1
