"""The live view tells the truth: the summary's definitions and window, start-up states, tokens across
restarts, training loss, time against its budget (issue 13, item 7)."""

from __future__ import annotations

import re
import time

from rich.console import Console

from ddiloco.launch.config import RunConfig
from ddiloco.launch.live import render
from ddiloco.launch.supervisor import Supervisor


def text_of(group) -> str:
    console = Console(width=250, record=True, file=open("/dev/null", "w"))
    console.print(group)
    return console.export_text()


def test_live_view_rows_and_head(tmp_path):
    sup = Supervisor(RunConfig(run_dir=tmp_path / "run", learners=3, duration=60.0))
    for slot in sup.learners:
        slot.state = "running"
    now = time.time()
    sup.shards[0].status = {
        "version_sum": 7,
        "merges": 7,
        "useful_seconds": 15.0,
        "started_wall": now - 40.0,
        "first_join_wall": now - 10.0,
        "stall_seconds_max": 2.5,
        "tokens_reported": 5000,
        "learners": {"1": {"step": 0, "tokens": 0}, "2": {"step": 12, "tokens": 900, "loss": 3.25}},
        "books": {"2": {"tokens_trained": 4100, "tokens_merged": 3000.0}},
    }
    rows = {r["id"]: r for r in sup.learner_rows()}
    assert [rows[m]["state"] for m in range(3)] == ["starting", "joining", "running"]
    assert rows[2]["tokens_trained"] == 4100 and rows[2]["tokens"] == 900  # this process vs all of them
    text = text_of(render(sup, eval_loss=2.5))
    # goodput over the window since the first join: 15 s / (3 learners x ~10 s) = 0.50, not 15 / (3 x 40)
    goodput = float(re.search(r"goodput (\d\.\d\d)", text).group(1))
    assert 0.4 <= goodput <= 0.5 and "stall max 2.5s" in text and "/ 60s" in text
    assert "3.250" in text and "4100" in text and "starting" in text and "joining" in text


def test_a_learner_that_left_at_the_end_is_not_shown_starting(tmp_path):
    """The last frame of a run: the learners' sessions are closed while their processes exit; one
    with booked work has left (it said "starting", with 88k tokens trained: issue #45)."""
    sup = Supervisor(RunConfig(run_dir=tmp_path / "run", learners=2, tokens=1000))
    for slot in sup.learners:
        slot.state = "running"
    sup.shards[0].status = {"learners": {}, "books": {"0": {"tokens_trained": 88_000, "tokens_merged": 80_000.0}}}
    rows = {r["id"]: r for r in sup.learner_rows()}
    assert (rows[0]["state"], rows[1]["state"]) == ("reconnecting", "starting")  # mid-run: cut off
    sup.stopping = True
    rows = {r["id"]: r for r in sup.learner_rows()}
    assert (rows[0]["state"], rows[1]["state"]) == ("left", "starting")


def test_goodput_so_far_ends_its_window_at_the_stop():
    """The last frame agreed with nothing (0.30 against the summary's 0.87): its window ran on through
    the drain. Both end where the stop was decided."""
    from ddiloco.launch.livestate import goodput_so_far

    shard = {"first_join_wall": 100.0, "useful_seconds": 16.0}
    assert goodput_so_far([shard], 2, 120.0) == 16.0 / (2 * 20.0)
    assert goodput_so_far([{**shard, "stop_wall": 110.0}], 2, 140.0) == 16.0 / (2 * 10.0)
