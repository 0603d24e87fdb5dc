"""`ddiloco demo`: four methods on one failure trace and one link, side by side, with the report written."""

from __future__ import annotations

import html
import json

import pytest
from typer.testing import CliRunner

from ddiloco.cli import _register, app
from ddiloco.cli.demo import METHODS, interpretation, loss_at, scaled_link
from ddiloco.records.rundir import load_run
from ddiloco.report.story import Story, load_story
from ddiloco.report.timeline import generations, learner_intervals, run_end

from ..launch.test_dashboard import CHROMIUM, dump_dom

_register()


def test_demo_compares_four_methods_on_the_same_failures_and_link(shakespeare, tmp_path):
    out = tmp_path / "demo"
    result = CliRunner().invoke(
        app,
        [
            "demo",
            "--model-size",
            "tiny",
            "--tokens",
            "12000",
            "--data",
            shakespeare,
            "--out",
            str(out),
            "--quiet",
            "--json",
        ],
        catch_exceptions=False,
    )
    assert result.exit_code == 0, result.output
    every = json.loads(result.stdout.strip().splitlines()[-1])
    assert set(METHODS) == {"decoupled", "diloco", "ddp", "elastic-ddp"} and set(METHODS) <= set(every)
    for m in METHODS:
        assert every[m]["method"] == m and every[m]["tokens"] >= 12000
    runs = [load_run(out / m) for m in METHODS]
    settings = [r.config["settings"] for r in runs]
    assert all(s["failures"] == settings[0]["failures"] for s in settings) and settings[0]["failures"]["outages"]
    assert all(s["link"] == settings[0]["link"] for s in settings), "the runs must share the link"
    first = min(every[m]["sim_seconds"] for m in METHODS)
    assert all(every[m]["eval_loss_at_first_finish"] is not None for m in METHODS if every[m]["sim_seconds"] == first)
    assert "At equal wall time" in result.stdout and "at equal tokens" in result.stdout
    assert (out / "report" / "report.html").is_file() and (out / "report" / "loss_vs_time.png").is_file()
    # the data-parallel runs' timelines show the trace's outages, as many as began before each run's end
    outages = settings[0]["failures"]["outages"]
    for m in ("ddp", "elastic-ddp"):
        run = runs[METHODS.index(m)]
        end = run_end(run)
        downs = sum(1 for spans in learner_intervals(run).values() for _, b in spans if b < end)
        assert downs == sum(1 for o in outages if o["down_at"] < end) > 0, m
    assert generations(runs[METHODS.index("ddp")]) and generations(runs[METHODS.index("elastic-ddp")])
    # the story the console told is the page's opening, and the moment it compares is marked
    story = load_story(out)
    assert story is not None and story.headline in result.stdout and story.moment == first
    page = (out / "report" / "report.html").read_text()
    assert html.escape(story.headline) in page and html.escape(story.moment_label) in page
    assert page.index(html.escape(story.headline)) < page.index("<img")
    assert "decoupled (decoupled)" not in page and "Decoupled DiLoCo" in page


@pytest.mark.skipif(CHROMIUM is None, reason="needs Chromium (apt-get install chromium; .ci/run installs it)")
def test_chromium_shows_the_demo_reports_headline_and_marked_moment(tmp_path):
    """A report from two short runs and a story, opened in headless Chromium: what a person sees."""
    base = tmp_path / "runs"
    trace = tmp_path / "trace.csv"
    trace.write_text("learner,down_at,up_at\n1,2.5,6.5\n")
    runner = CliRunner()
    for m in ("decoupled", "elastic-ddp"):
        args = ["sim", "--model-size", "tiny", "--seq-len", "16", "--batch-size", "4", "--tokens", "3000"]
        args += ["--learners", "2", "--method", m, "--chaos-trace", str(trace), "--run-dir", str(base / m), "--quiet"]
        assert runner.invoke(app, args, catch_exceptions=False).exit_code == 0
    Story("Two learners, one of them down for 4 s.", "Decoupled DiLoCo is lowest at 5 s.", 5.0, "5 s, mid-run").save(
        base
    )
    result = runner.invoke(app, ["report", str(base)], catch_exceptions=False)
    assert result.exit_code == 0, result.output
    url = (base / "report" / "report.html").as_uri()
    dom = dump_dom(url, 1000)
    assert "Decoupled DiLoCo is lowest at 5 s." in dom and "Marked on the loss-against-time plot: 5 s, mid-run" in dom
    assert dom.count("<img") == 5  # loss twice, goodput, a timeline per run
    shot = tmp_path / "report.png"
    dump_dom(url, 1000, screenshot=str(shot))
    assert shot.is_file() and shot.stat().st_size > 10_000


def test_the_link_makes_one_all_reduce_take_a_step_by_hand():
    link = scaled_link(1_000_000, latency=0.05)
    assert link.transfer(2 * 1_000_000 * 2.0) == pytest.approx(0.05 + 1.0)  # 2 x params x bf16 in one step


def test_loss_at_interpolates_between_eval_points():
    metrics = [
        {"kind": "eval", "t": 10.0, "eval_loss": 4.0},
        {"kind": "train", "t": 15.0, "train_loss": 9.0},
        {"kind": "eval", "t": 20.0, "eval_loss": 3.0},
    ]
    assert loss_at(metrics, 5.0) is None
    assert loss_at(metrics, 15.0) == pytest.approx(3.5)
    assert loss_at(metrics, 99.0) == 3.0


def test_interpretation_names_the_winner_at_equal_time_and_at_equal_tokens_from_the_numbers():
    results = {
        "decoupled": {"sim_seconds": 200.0, "eval_loss": 2.5, "eval_loss_at_first_finish": 2.5},
        "diloco": {"sim_seconds": 260.0, "eval_loss": 2.45, "eval_loss_at_first_finish": 2.7},
        "ddp": {"sim_seconds": 500.0, "eval_loss": 2.3, "eval_loss_at_first_finish": 2.9},
        "elastic-ddp": {"sim_seconds": 450.0, "eval_loss": 2.31, "eval_loss_at_first_finish": None},
    }
    text = interpretation(results)
    assert text.startswith("At equal wall time (200 simulated s, when Decoupled DiLoCo finished) Decoupled DiLoCo")
    assert "at equal tokens DDP is lowest (2.300;" in text and "elastic DDP not yet evaluated" in text
    results["diloco"]["eval_loss_at_first_finish"] = 2.4
    assert "Decoupled DiLoCo finished) DiLoCo is lowest in eval loss (2.400;" in interpretation(results)
