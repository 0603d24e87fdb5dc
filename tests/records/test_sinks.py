"""A metrics log hands every numeric value to its sinks: TensorBoard gets `<kind>/<name>` against
tokens trained, the same numbers metrics.jsonl holds."""

from __future__ import annotations

import json

import pytest

from ddiloco.records.rundir import MetricsLog
from ddiloco.records.sinks import TensorBoardSink


def test_tensorboard_sink_gets_what_metrics_jsonl_gets(tmp_path):
    pytest.importorskip("tensorboard", reason="tensorboard is an optional extra (pip install 'ddiloco[tensorboard]')")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    log = MetricsLog(tmp_path / "metrics.jsonl", [TensorBoardSink(tmp_path / "tb")])
    log.write("eval", 1.0, 1000, eval_loss=3.25, note=None)
    log.write("eval", 2.0, 2000, eval_loss=2.5)
    log.write("train", 2.5, 2048, train_loss=2.75, straggler=True)
    log.close()
    log.close()  # a second close is harmless
    lines = [json.loads(x) for x in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [x["kind"] for x in lines] == ["eval", "eval", "train"] and "note" not in lines[0]
    events = EventAccumulator(str(tmp_path / "tb"))
    events.Reload()
    assert set(events.Tags()["scalars"]) == {"eval/eval_loss", "train/train_loss"}  # a bool is no scalar
    assert [(e.step, e.value) for e in events.Scalars("eval/eval_loss")] == [(1000, 3.25), (2000, 2.5)]
    with pytest.raises(ValueError, match="unknown metric kind"):
        MetricsLog(None).write("nonsense", 0.0, 0)
