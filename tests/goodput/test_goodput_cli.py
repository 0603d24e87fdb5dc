"""`ddiloco goodput` as a user runs it: lists, a JSON last line, a plot, a trace, clear errors."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

import ddiloco.cli.goodput  # noqa: F401  (registers the command)
from ddiloco.chaos.trace import FailureTrace
from ddiloco.cli import app

QUICK = ["--days", "0.25", "--seeds", "2"]


def invoke(*args: str):
    return CliRunner().invoke(app, ["goodput", *args], catch_exceptions=False, env={"COLUMNS": "300"})


def test_space_separated_lists_and_json_last_line():
    out = invoke("--chips", "150000", "300000", "--learners", "2", "4", *QUICK, "--json")
    assert out.exit_code == 0, out.output
    payload = json.loads(out.stdout.strip().splitlines()[-1])
    rows = payload["results"]
    assert {r["method"] for r in rows} == {"ddp", "elastic-ddp", "diloco", "decoupled"}
    assert {r["chips"] for r in rows} == {150_000, 300_000}
    assert {r["learners"] for r in rows if r["method"] == "decoupled"} == {2, 4}
    assert len(rows) == 2 * (2 + 2 * 2)
    for r in rows:
        assert {"method", "learners", "chips", "goodput", "goodput_ci", "uptime"} <= set(r)
        assert 0 < r["goodput"] <= 1 and 0 < r["uptime"] <= 1 and r["goodput_ci"] >= 0
    assert payload["sim_wall_seconds"] > 0
    assert "sim_wall_seconds" in out.stdout  # the run time is on the terminal too


def test_repeated_flags_work_too_and_methods_can_be_chosen():
    out = invoke(
        "--chips", "150000", "--chips", "300000", "--methods", "ddp", "decoupled", "--learners", "2", *QUICK, "--json"
    )
    assert out.exit_code == 0, out.output
    rows = json.loads(out.stdout.strip().splitlines()[-1])["results"]
    assert {r["method"] for r in rows} == {"ddp", "decoupled"} and len(rows) == 4


def test_plot_and_trace_files(tmp_path):
    png, csv = tmp_path / "g.png", tmp_path / "t.csv"
    out = invoke(
        "--chips",
        "150000",
        "300000",
        "--learners",
        "2",
        *QUICK,
        "--plot",
        str(png),
        "--trace-out",
        str(csv),
        "--trace-learners",
        "3",
        "--trace-scale",
        "60",
    )
    assert out.exit_code == 0, out.output
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    trace = FailureTrace.load(csv)
    assert trace.learners == {0, 1, 2}
    assert max(o.up_at for o in trace.outages) <= 0.25 * 86400 / 60


@pytest.mark.parametrize(
    "args, message",
    [
        (["--chips", "0"], "chip counts must be >= 1"),
        (["--learners", "0"], "learner counts must be >= 1"),
        (["--methods", "magic"], "unknown method"),
        (["--quorum", "3", "--learners", "2"], "quorum"),
        (["--chips", "512", "--learners", "4"], "need at least one slice"),
        (["--mtbi-years", "-1"], "--mtbi-years must be > 0"),  # the flag, not the Python field
        (["--repair-dist", "weibull"], "--repair-dist"),
        (["--seeds", "0"], "--seeds"),
        (["--trace-out", "x.csv", "--trace-scale", "0"], "--trace-scale"),
    ],
)
def test_bad_flags_fail_with_a_clear_message(args, message):
    out = invoke("--days", "0.01", "--seeds", "1", *args)
    assert out.exit_code == 2
    assert message in out.output
