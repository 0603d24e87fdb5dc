"""`ddiloco run --method streaming` with real processes: every learner in every round, and learners
that wait for a merged fragment more than tau steps overdue when one of them is held back."""

import json

import pytest

from ddiloco.learner.journal import read_journals
from ddiloco.records.events import read_events

from .test_run import assert_all_ended, ddiloco_run


@pytest.mark.timeout(150)
def test_streaming_runs_every_learner_in_every_round_and_waits_for_a_stopped_one(tmp_path, shakespeare):
    flags = ["--method", "streaming", "--learners", "2", "-P", "2", "--sync-every", "4", "--overlap", "1"]
    chaos = ["--straggle", "0.5", "--straggle-every", "1.5"]  # SIGSTOP a learner now and then, below the timeout
    out, run_dir = ddiloco_run(tmp_path, shakespeare, *flags, "--tokens", "12000", *chaos)
    assert out.returncode == 0, out.stderr[-3000:]
    result = json.loads(out.stdout.strip().splitlines()[-1])
    assert (result["method"], result["fragments"], result["overlap"], result["quorum"], result["grace"]) == (
        "streaming",
        2,
        1,
        2,
        0.0,
    )
    assert result["tokens_trained"] >= 12000 and result["outer_steps"] > 0
    events = list(read_events(run_dir / "sync-0" / "events.jsonl"))
    merges = [e for e in events if e["kind"] == "merge"]
    # Once both learners have joined every round waits for both (K = M). Exceptions: a learner declared
    # gone meanwhile (a heartbeat lost to a loaded machine), the round open when the second one joined,
    # and the final flush (up to one round per fragment, where a learner with nothing unsent declines).
    gone = sum(1 for e in events if e["kind"] == "leave" and e.get("reason") != "left")
    joined = max(e["t"] for e in events if e["kind"] == "join")
    after_both = [e for e in merges if e["t"] > joined]
    assert len(after_both) >= 6, "too few outer steps after both learners joined"
    short = sum(e["expected"] != 2 or len(e["admitted"]) != 2 for e in after_both)
    assert short <= 1 + 2 + gone, [(e["expected"], e["learners"]) for e in after_both]
    # the straggler held the other back: a learner waited for a merged fragment at least once
    journals = [j for m in range(2) for j in read_journals(run_dir / f"learner-{m}", "journal-*.json")]
    assert journals and sum(j["waits"] for j in journals) >= 1, journals
    assert_all_ended(run_dir)
