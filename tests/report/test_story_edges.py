"""The report's edges: a story file that is not one, the loss axis's zoom and its note, a timeline with
neither merges nor generations."""

from __future__ import annotations

import json
from pathlib import Path

from ddiloco.records.rundir import RunRecord
from ddiloco.report.plots import focus, loss_curves, timelines
from ddiloco.report.story import Story, load_story


def record(tmp_path: Path, metrics: list[dict], events: list[dict] | None = None) -> RunRecord:
    config = {"command": "sim", "settings": {"method": "decoupled", "learners": 2}, "clock_origin": 0.0}
    return RunRecord(tmp_path, config, {"sim_seconds": 10.0}, metrics, events or [])


def test_a_story_file_that_is_not_one_is_no_story(tmp_path):
    assert load_story(tmp_path) is None  # absent
    (tmp_path / "story.json").write_text("[1, 2]")
    assert load_story(tmp_path) is None
    (tmp_path / "story.json").write_text(json.dumps({"scenario": "s", "headline": 3}))
    assert load_story(tmp_path) is None
    (tmp_path / "story.json").write_text("\x85 not json")
    assert load_story(tmp_path) is None
    Story("s", "h", 4, "then").save(tmp_path)
    assert load_story(tmp_path) == Story("s", "h", 4.0, "then")


def test_the_loss_axis_leaves_out_each_curves_first_fifteen_percent_by_hand():
    assert focus([]) is None and focus([([], [])]) is None
    xs, ys = [0.0, 10.0, 20.0, 100.0], [5.0, 3.0, 2.5, 2.0]
    lo, hi = focus([(xs, ys)])  # kept: x >= 15, so 2.5 and 2.0; padded by 8 % of 0.5
    assert (round(lo, 6), round(hi, 6)) == (1.96, 2.54)


def test_a_zoomed_plot_and_an_empty_timeline_are_drawn(tmp_path):
    metrics = [
        {"kind": "eval", "t": float(t), "tokens": t, "eval_loss": loss} for t, loss in enumerate([5, 3, 2.5, 2.4])
    ]
    out = loss_curves([record(tmp_path, metrics)], "t", tmp_path / "loss.png", Story("s", "h", 2.0, ""))
    assert out.read_bytes()[:4] == b"\x89PNG"
    path = timelines(record(tmp_path, metrics), "Decoupled DiLoCo", tmp_path / "timeline.png")
    assert path.stat().st_size > 1000
