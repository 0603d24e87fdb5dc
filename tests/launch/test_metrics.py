"""`RunMetrics` through a fake `RunView`: the records a run's metrics.jsonl gets (train loss, progress,
eval of the fetched global model), their time origin, and a loop that ends when the run does. The
local supervisor and the Slurm launcher hand it the same view, so this covers both."""

from __future__ import annotations

import json
import math
import threading
import time
from pathlib import Path

import pytest

from ddiloco.launch import metrics as metrics_module
from ddiloco.launch.evaluate import evaluate_params
from ddiloco.launch.metrics import RunMetrics, RunView
from ddiloco.records.rundir import MetricsLog

STATUS = {
    "tokens_reported": 6400,
    "useful_seconds": 30.0,
    "tokens_merged": 5000.0,
    "learners": {"0": {"loss": 3.0}, "1": {"loss": 4.0}, "2": {"step": 1}},
}


def records(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()] if path.is_file() else []


def view(start_wall: float, statuses: list[dict], addresses: list[str], stopping=lambda: False) -> RunView:  # noqa: ANN001
    return RunView(start_wall, 2, addresses=lambda: addresses, statuses=lambda: statuses, stopping=stopping)


def global_params(tiny_task) -> dict:  # noqa: ANN001
    return {k: v.detach().clone() for k, v in tiny_task.build_model(0).named_parameters()}


def test_one_record_writes_train_progress_and_eval_from_the_view(tmp_path, tiny_task, monkeypatch):
    params = global_params(tiny_task)
    asked: list[list[str]] = []
    monkeypatch.setattr(metrics_module, "fetch_params", lambda addrs, token: asked.append(addrs) or params)
    now = time.time()
    status = {**STATUS, "started_wall": now - 30.0}  # 2 learners x 30 s, 30 useful seconds: goodput 0.5
    rm = RunMetrics(
        view(now - 10.0, [status], ["h:1", "h:2"]), tiny_task, MetricsLog(tmp_path / "m.jsonl"), 1.0, 0, None, 3
    )
    rm.record()
    rm.metrics.close()
    by_kind = {r["kind"]: r for r in records(tmp_path / "m.jsonl")}
    assert set(by_kind) == {"train", "progress", "eval"}
    assert by_kind["train"]["train_loss"] == pytest.approx(3.5)  # learners with a loss only
    assert by_kind["progress"]["goodput"] == pytest.approx(0.5, abs=0.01)
    assert by_kind["progress"]["tokens_merged"] == 5000.0
    assert all(r["tokens"] == 6400 for r in by_kind.values())
    assert all(10.0 <= r["t"] < 15.0 for r in by_kind.values())  # seconds since the view's start_wall
    assert math.isfinite(by_kind["eval"]["eval_loss"]) and rm.latest["loss"] == by_kind["eval"]["eval_loss"]
    # on the run's --eval-batches, the final evaluation's yardstick (the curve was on 4 whatever it said)
    assert by_kind["eval"]["eval_batches"] == 3
    assert by_kind["eval"]["eval_loss"] == pytest.approx(evaluate_params(tiny_task, 0, params, 3)["eval_loss"])
    assert by_kind["eval"]["eval_loss"] != pytest.approx(evaluate_params(tiny_task, 0, params, 1)["eval_loss"])
    assert asked == [["h:1", "h:2"]]  # the addresses the view gives at this record
    assert [h["kind"] for h in rm.history] == ["train", "eval"]  # the dashboard's curves


def test_no_shard_yet_and_no_answer_write_nothing(tmp_path, tiny_task, monkeypatch):
    calls: list[list[str]] = []
    monkeypatch.setattr(metrics_module, "fetch_params", lambda addrs, token: calls.append(addrs))
    log = MetricsLog(tmp_path / "m.jsonl")
    RunMetrics(view(time.time(), [], []), tiny_task, log, 1.0, 0, None, 1).record()  # nothing started
    RunMetrics(view(time.time(), [], ["h:1"]), tiny_task, log, 1.0, 0, None, 1).record()  # fetch failed: None
    log.close()
    assert records(tmp_path / "m.jsonl") == [] and calls == [["h:1"]]


def test_the_loop_records_until_the_run_stops_and_ends_at_once_when_it_ends(tmp_path, tiny_task, monkeypatch):
    params = global_params(tiny_task)
    monkeypatch.setattr(metrics_module, "fetch_params", lambda addrs, token: params)
    stop = threading.Event()
    v = view(time.time(), [{**STATUS, "started_wall": time.time()}], ["h:1"], stopping=stop.is_set)
    rm = RunMetrics(v, tiny_task, MetricsLog(tmp_path / "m.jsonl"), 0.05, 0, None, eval_batches=1)
    rm.start()
    deadline = time.monotonic() + 30.0
    while time.monotonic() < deadline and sum(r["kind"] == "eval" for r in records(tmp_path / "m.jsonl")) < 3:
        time.sleep(0.05)
    stop.set()  # the run is stopping: the loop ends after its current wait
    rm.join(10.0)
    assert not rm._thread.is_alive()
    evals = [r["t"] for r in records(tmp_path / "m.jsonl") if r["kind"] == "eval"]
    assert len(evals) >= 3 and evals == sorted(evals) and len(set(evals)) == len(evals)

    slow = RunMetrics(view(time.time(), [], []), tiny_task, MetricsLog(None), 3600.0, 0, None, 1)
    slow.start()
    began = time.monotonic()
    slow.view.ended.set()  # what the launcher sets when the run ends: no waiting out the hour
    slow.join(10.0)
    assert not slow._thread.is_alive() and time.monotonic() - began < 5.0


def test_no_period_no_thread(tmp_path, tiny_task):
    rm = RunMetrics(view(time.time(), [], []), tiny_task, MetricsLog(None), 0.0, 0, None, 1)
    rm.start()
    rm.join(1.0)
    assert not rm._thread.is_alive()
