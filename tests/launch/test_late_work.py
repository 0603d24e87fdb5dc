"""Late work over an emulated long link, in real processes: merged in a later round, once, and every
trained token accounted by cause."""

import collections
import json

import pytest

from ddiloco.records.events import read_events

from .test_run import assert_all_ended, ddiloco_run


@pytest.mark.timeout(240)
def test_work_that_misses_its_round_behind_a_long_link_is_merged_once_in_a_later_round(tmp_path, shakespeare):
    # K = 1 and no grace: each round merges at its first contribution, so every other learner's work
    # for that version arrives after its round closed (100 ms each way, a connection per push)
    args = ["--learners", "3", "--tokens", "12000", "--quorum", "1", "--grace", "0", "--sync-every", "8"]
    args += ["--net-latency", "100", "--min-step-seconds", "0.05"]
    out, run_dir = ddiloco_run(tmp_path, shakespeare, *args, timeout=200)
    assert out.returncode == 0, out.stderr[-3000:]
    result = json.loads(out.stdout.strip().splitlines()[-1])
    assert_all_ended(run_dir)
    merges = [e for d in run_dir.glob("sync-*") for e in read_events(d / "events.jsonl") if e.get("kind") == "merge"]
    admitted = [(m["fragment"], a) for m in merges for a in m["admitted"]]
    late = [(p, a) for p, a in admitted if a["late"] > 0]
    assert late, "no contribution missed its round: the test did not exercise late work"
    # once: no snapshot (a learner's fragment at a stream position) is merged twice
    snapshots = collections.Counter((a["learner"], a.get("incarnation"), p, a.get("position")) for p, a in admitted)
    assert max(snapshots.values()) == 1
    assert result["double_merged_steps"] == 0
    # the only refusals: work more than S versions late (this link is longer than a whole period H)
    events = [e for d in run_dir.glob("sync-*") for e in read_events(d / "events.jsonl")]
    refusals = [e for e in events if e.get("kind") == "rejected"]
    assert all(e["code"] == "stale" and "max_staleness" in e["reason"] for e in refusals), refusals[:3]
    # counted once, and each cause measured where it happens: the merge events (tokens_merged) agree with
    # the shards' own ledgers, and the learners sent no more than they trained
    causes = result["tokens_by_cause"]
    assert causes["merged"] == pytest.approx(result["tokens_merged"])
    ledgers = [json.loads((d / "summary.json").read_text()) for d in run_dir.glob("sync-*")]
    assert sum(float(s["tokens_merged"]) for s in ledgers) == pytest.approx(result["tokens_merged"], rel=1e-6)
    assert causes["sent"] + causes["overwritten"] <= result["tokens_trained"] + 1.0
    assert causes["in_transit"] == pytest.approx(0.0, abs=1.0)  # every push landed before its learner left
    assert (causes["refused"] > 0) == bool(refusals)
    assert all(v is None or v >= -1.0 for v in causes.values())
