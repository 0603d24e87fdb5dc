"""A run directory holds the whole story, and `ddiloco report` draws it (issue 13, items 1 and 2)."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from ddiloco.cli import _register, app
from ddiloco.records.rundir import load_run
from ddiloco.report.timeline import learner_intervals, merges

_register()
runner = CliRunner()
TINY = [
    "--model-size",
    "tiny",
    "--seq-len",
    "16",
    "--batch-size",
    "4",
    "--tokens",
    "6000",
    "--learners",
    "3",
    "--fragments",
    "2",
    "--sync-every",
    "4",
    "--quiet",
    "--json",
]


def sim(shakespeare, *extra):
    result = runner.invoke(app, ["sim", *TINY, "--data", shakespeare, *extra], catch_exceptions=False)
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def two_runs(tmp_path_factory, shakespeare):
    base = tmp_path_factory.mktemp("runs")
    trace = base / "trace.csv"
    trace.write_text("learner,down_at,up_at\n1,5.5,12.5\n")
    out = {}
    for method in ("decoupled", "elastic-ddp"):
        out[method] = sim(shakespeare, "--method", method, "--chaos-trace", str(trace), "--run-dir", str(base / method))
    return base, out


def test_sim_run_dir_holds_config_summary_metrics_and_events(two_runs):
    base, results = two_runs
    record = load_run(base / "decoupled")
    settings = record.config["settings"]
    assert settings["learners"] == 3 and settings["algorithm"]["fragments"] == 2 and settings["tokens"] == 6000
    assert {"ddiloco", "torch", "python"} <= set(record.config["versions"])
    assert record.summary == results["decoupled"]
    evals = [m for m in record.metrics if m["kind"] == "eval"]
    assert len(evals) >= 10 and evals[-1]["tokens"] >= 6000
    assert [m["tokens"] for m in evals] == sorted(m["tokens"] for m in evals)
    assert all(m["eval_loss"] > 0 for m in evals) and evals[-1]["eval_loss"] < evals[0]["eval_loss"]
    assert {m["eval_batches"] for m in evals} == {record.summary["eval_batches"]} == {20}  # one yardstick
    assert any(m["kind"] == "train" for m in record.metrics) and any(m["kind"] == "progress" for m in record.metrics)
    assert {e["kind"] for e in record.events} >= {"down", "up", "join", "merge"}


@pytest.mark.slow  # a whole run on the virtual clock or in processes: minutes under load on 2 cores
def test_recording_does_not_change_the_run(two_runs, shakespeare, tmp_path):
    base, results = two_runs
    trace = base / "trace.csv"
    plain = sim(shakespeare, "--method", "decoupled", "--chaos-trace", str(trace))
    recorded = results["decoupled"]
    assert plain["eval_loss"] == recorded["eval_loss"] and plain["goodput"] == recorded["goodput"]


def test_timelines_come_from_the_events(two_runs):
    base, _ = two_runs
    record = load_run(base / "decoupled")
    up = learner_intervals(record)
    assert len(up[0]) == 1 and len(up[1]) == 2  # learner 1 was down from 5.5 to 12.5
    assert up[1][0][1] == pytest.approx(5.5) and up[1][1][0] == pytest.approx(12.5)
    points = merges(record)
    assert points and all(0 <= p.fragment < 2 and 1 <= p.admitted <= 3 for p in points)


def test_report_overlays_runs_in_pngs_and_one_html_page(two_runs, tmp_path):
    base, _ = two_runs
    out = tmp_path / "report"
    result = runner.invoke(
        app, ["report", str(base / "decoupled"), str(base / "elastic-ddp"), "--out", str(out)], catch_exceptions=False
    )
    assert result.exit_code == 0, result.output
    pngs = sorted(out.glob("*.png"))
    assert {p.name for p in pngs} >= {"loss_vs_tokens.png", "loss_vs_time.png", "goodput.png"}
    assert len([p for p in pngs if p.name.startswith("timeline_")]) == 2
    for p in pngs:
        assert p.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and p.stat().st_size > 5000
    page = (out / "report.html").read_text()
    assert page.count("data:image/png;base64,") == len(pngs)
    assert "<th>Decoupled DiLoCo</th>" in page and "<th>elastic DDP</th>" in page and "(decoupled)" not in page


def test_report_takes_a_folder_of_runs_as_the_demo_writes_it(two_runs):
    base, _ = two_runs
    result = runner.invoke(app, ["report", str(base)], catch_exceptions=False)
    assert result.exit_code == 0, result.output
    assert len(list((base / "report").glob("timeline_*.png"))) == 2 and (base / "report" / "report.html").is_file()


def test_report_refuses_what_is_not_a_run_directory(tmp_path):
    result = runner.invoke(app, ["report", str(tmp_path)], env={"COLUMNS": "300"})
    assert result.exit_code == 2 and "not a run directory" in result.output


@pytest.mark.slow  # a whole run on the virtual clock or in processes: minutes under load on 2 cores
def test_tensorboard_gets_the_same_metrics(shakespeare, tmp_path):
    pytest.importorskip("tensorboard", reason="tensorboard is an optional extra (pip install 'ddiloco[tensorboard]')")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    sim(shakespeare, "--run-dir", str(tmp_path / "run"), "--tensorboard", str(tmp_path / "tb"))
    events = EventAccumulator(str(tmp_path / "tb"))
    events.Reload()
    scalars = events.Tags()["scalars"]
    assert {"eval/eval_loss", "train/train_loss", "progress/goodput"} <= set(scalars)
    record = load_run(tmp_path / "run")
    logged = [m["eval_loss"] for m in record.metrics if m["kind"] == "eval"]
    assert [pytest.approx(e.value, rel=1e-6) for e in events.Scalars("eval/eval_loss")] == logged


def test_wandb_offline_gets_the_same_metrics(shakespeare, tmp_path):
    pytest.importorskip("wandb", reason="wandb is an optional extra (pip install 'ddiloco[wandb]')")
    from ..support.runtime import wait_for
    from ..support.wandb_file import history

    sim(shakespeare, "--run-dir", str(tmp_path / "run"), "--wandb")
    files = list((tmp_path / "run" / "wandb").glob("offline-run-*/run-*.wandb"))
    assert len(files) == 1, "one offline wandb run inside the run directory"
    logged = [m["eval_loss"] for m in load_run(tmp_path / "run").metrics if m["kind"] == "eval"]
    # wandb's own service process writes the file; under load it lands shortly after finish() returns
    rows = wait_for(
        lambda: (r := history(files[0])) and sum("eval/eval_loss" in x for x in r) >= len(logged) and r,
        60,
        0.5,
        "wandb's service to write the run file",
    )
    assert [r["eval/eval_loss"] for r in rows if "eval/eval_loss" in r] == pytest.approx(logged, rel=1e-9)
    assert any("train/train_loss" in r for r in rows) and any("progress/goodput" in r for r in rows)
    assert all("tokens" in r for r in rows)


def test_missing_metric_library_is_a_usage_error_naming_the_flag(shakespeare, tmp_path, monkeypatch):
    import builtins

    real_import = builtins.__import__

    def no_wandb(name, *args, **kwargs):
        if name == "wandb" or name.startswith("wandb."):
            raise ImportError(name)
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_wandb)
    result = runner.invoke(app, ["sim", *TINY, "--data", shakespeare, "--wandb"], env={"COLUMNS": "300"})
    assert result.exit_code == 2 and "--wandb" in result.output and "pip install" in result.output
