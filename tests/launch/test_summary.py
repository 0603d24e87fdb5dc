import json

import pytest

from ddiloco.launch.summary import bandwidth, overlap_chosen, summarize, tokens_by_cause
from ddiloco.learner.journal import Journal


def write_events(path, events):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(e) + "\n" for e in events))


def test_goodput_uptime_and_stall_from_merge_records(tmp_path):
    work = lambda m, seconds, tokens, share, a, b: {  # noqa: E731
        "learner": m,
        "steps": 2,
        "tokens": tokens,
        "seconds": seconds,
        "share": share,
        "span_start": a,
        "snapshot_wall": b,
    }
    write_events(
        tmp_path / "sync-0" / "events.jsonl",
        [
            {"t": 100.0, "kind": "join", "learner": 0},
            {"t": 101.0, "kind": "join", "learner": 1},
            {"t": 104.0, "kind": "merge", "fragment": 0, "admitted": [work(0, 2.0, 100, 0.5, 100.0, 104.0)]},
            {
                "t": 107.0,
                "kind": "merge",
                "fragment": 1,
                "admitted": [work(1, 4.0, 60, 0.5, 103.0, 107.0), work(0, 2.0, 40, 0.5, 105.0, 107.0)],
            },
            {"t": 108.0, "kind": "rejected", "learner": 1},
            {"t": 110.0, "kind": "stop"},
            {"t": 111.0, "kind": "merge", "fragment": 0, "admitted": []},
        ],
    )
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


def test_bytes_per_step_against_a_ring_all_reduce_by_hand():
    # two shards of 600 + 400 parameters; 4 learners took 100 steps in all. A ring of 4 workers moves
    # 2 * 3/4 * 1000 * 2 bytes (bf16) = 3000 each way per worker per step.
    statuses = [
        {"params": 600, "bytes_received": 2400, "bytes_sent": 3600},
        {"params": 400, "bytes_received": 1600, "bytes_sent": 8400},
    ]
    b = bandwidth(statuses, steps=100, learners=4)
    assert (b["bytes_up_per_step"], b["bytes_down_per_step"], b["inner_steps"]) == (40, 120, 100)
    assert b["allreduce_bf16_bytes_per_step"] == 3000 and b["allreduce_workers"] == 4
    assert b["bandwidth_ratio_up"] == pytest.approx(75) and b["bandwidth_ratio_down"] == pytest.approx(25)
    assert b["bandwidth_ratio_both_ways"] == pytest.approx(2 * 3000 / (40 + 120))  # 37.5: between the two
    assert bandwidth([{"params": 10}], steps=0, learners=4)["bandwidth_ratio_up"] is None


def test_every_trained_token_has_one_cause_by_hand():
    journals = [
        {"tokens": 1000, "tokens_sent": 900.0, "tokens_overwritten": 60.0},  # 40 never left: killed
        {"tokens": 500, "tokens_sent": 500.0, "tokens_overwritten": 0.0},
    ]
    statuses = [{"tokens_refused": 100.0}, {"tokens_refused": 50.0}]  # two shards
    causes = tokens_by_cause(journals, statuses, trained=1500, merged=1200.0)
    assert causes == {
        "trained": 1500,
        "merged": 1200.0,
        "overwritten": 60.0,
        "refused": 150.0,
        "unsent": 40.0,
        "in_transit": 1400.0 - 1200.0 - 150.0,  # sent, neither merged nor refused
        "sent": 1400.0,
    }
    parts = ("merged", "overwritten", "refused", "unsent", "in_transit")
    assert sum(causes[k] for k in parts) == pytest.approx(causes["trained"])
    # a journal from before 0.4 says nothing of what it sent: the split is not guessed
    assert tokens_by_cause([{"tokens": 10}], statuses, 10, 5.0) == {"trained": 10, "merged": 5.0, "sent": None}


def test_each_learners_last_tau_and_why_are_in_the_summary(tmp_path):
    for name, records in {"learner-0": [(1.0, 2, "x"), (5.0, 7, "tau_0 2 + ceil(...)")], "learner-1": []}.items():
        for i, (updated, tau, why) in enumerate(records):
            j = Journal(tmp_path / name / f"journal-{i}.json")
            j.write({"updated": updated, "overlap": tau, "overlap_why": why})
            j.close()
        (tmp_path / name).mkdir(exist_ok=True)
    chosen = overlap_chosen([tmp_path / "learner-0", tmp_path / "learner-1"])
    assert chosen == {"learner-0": {"tau": 7, "why": "tau_0 2 + ceil(...)"}}


def test_merges_a_shard_crash_lost_are_not_counted(tmp_path):
    # the shard logs v1 and v2 of fragment 0 and v1 of fragment 2, dies with v1 of each on disk,
    # restarts and merges fragment 0's v2 anew from the work sent again: v2's first merge never counted
    work = {"learner": 0, "steps": 4, "tokens": 100, "seconds": 1.0, "share": 0.5}
    write_events(
        tmp_path / "sync-0" / "events.jsonl",
        [
            {"t": 100.0, "kind": "join", "learner": 0},
            {"t": 101.0, "kind": "merge", "fragment": 0, "version": 1, "admitted": [work]},
            {"t": 102.0, "kind": "merge", "fragment": 2, "version": 1, "admitted": [work]},
            {"t": 103.0, "kind": "merge", "fragment": 0, "version": 2, "admitted": [work]},
            {"t": 105.0, "kind": "restored", "versions": {"0": 1, "2": 1}},
            {"t": 106.0, "kind": "merge", "fragment": 0, "version": 2, "admitted": [dict(work, tokens=180)]},
            {"t": 110.0, "kind": "stop"},
        ],
    )
    s = summarize([tmp_path / "sync-0"], [tmp_path / "learner-0"], learners=1, end_wall=120.0, fallback_start=0.0)
    assert s["tokens_merged"] == pytest.approx((100 + 100 + 180) * 0.5)
    assert s["outer_steps"] == 3 and s["contributions"] == 3


def test_goodput_never_exceeds_utilization_when_every_step_is_merged(tmp_path):
    # the same step times summed in two orders: 0.1 + 0.2 + 0.3 != 0.3 + 0.2 + 0.1 in binary floats
    admitted = [
        {"learner": 0, "tokens": 10, "seconds": s, "share": 1.0, "span_start": 0.0, "snapshot_wall": 1.0}
        for s in (0.1, 0.2, 0.3)
    ]
    assert sum(a["seconds"] for a in admitted) > 0.3 + 0.2 + 0.1
    write_events(
        tmp_path / "sync-0" / "events.jsonl",
        [{"t": 0.0, "kind": "join", "learner": 0}, {"t": 1.0, "kind": "merge", "fragment": 0, "admitted": admitted}]
        + [{"t": 1.0, "kind": "stop"}],
    )
    for name, seconds in zip("abc", (0.3, 0.2, 0.1), strict=True):  # read back in name order
        j = Journal(tmp_path / "learner-0" / f"journal-{name}.json")
        j.write({"tokens": 10, "seconds": seconds})
        j.close()
    s = summarize([tmp_path / "sync-0"], [tmp_path / "learner-0"], learners=1, end_wall=1.0, fallback_start=0.0)
    assert 0 < s["goodput"] <= s["utilization"] and s["goodput"] == pytest.approx(0.6)


def test_merged_tokens_summed_from_shares_are_not_more_than_the_whole(tmp_path):
    # 64 tokens in nine shares of 1/9: the float sum is 64.00000000000001, more than was trained
    admitted = [
        {"learner": 0, "tokens": 64, "seconds": 0.1, "share": 1 / 9, "span_start": 0.0, "snapshot_wall": 1.0}
        for _ in range(9)
    ]
    assert sum(a["tokens"] * a["share"] for a in admitted) > 64
    write_events(
        tmp_path / "sync-0" / "events.jsonl",
        [{"t": 0.0, "kind": "join", "learner": 0}, {"t": 1.0, "kind": "merge", "fragment": 0, "admitted": admitted}]
        + [{"t": 1.0, "kind": "stop"}],
    )
    j = Journal(tmp_path / "learner-0" / "journal-a.json")
    j.write({"tokens": 64, "seconds": 1.0})
    j.close()
    s = summarize([tmp_path / "sync-0"], [tmp_path / "learner-0"], learners=1, end_wall=1.0, fallback_start=0.0)
    assert s["tokens_merged"] <= s["tokens_trained"] == 64 and s["tokens_lost"] == 0
