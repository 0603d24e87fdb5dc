"""What a followed Slurm run records, without Slurm: availability from the learners' journals, the
shards' addresses read again at every call, and a run that left no checkpoint ends with a clear error
but still writes config.json, summary.json and the final record (the real run: test_slurm.py)."""

from __future__ import annotations

import json
import math
import time

import pytest

from ddiloco.backends.slurm_record import SlurmRecord, availability, live_addresses, live_statuses
from ddiloco.launch.config import RunConfig


def test_availability_is_the_union_of_each_learners_process_spans_inside_the_window():
    journals = [
        [{"started": 0.0, "updated": 60.0}, {"started": 50.0, "updated": 100.0}],  # overlap counted once
        [{"started": 10.0, "updated": 40.0}, {"started": 70.0, "updated": 200.0}],  # down 40..70, clipped at 100
    ]
    assert availability(journals, 0.0, 100.0, 2) == pytest.approx((100 + 30 + 30) / 200)
    assert availability([[]], 0.0, 100.0, 2) == 0.0  # a learner that never ran is down all along
    assert availability(journals, 5.0, 5.0, 2) == 0.0


def test_addresses_are_read_again_and_wait_for_every_shard(tmp_path):
    for s in range(2):
        (tmp_path / f"sync-{s}").mkdir()
    (tmp_path / "sync-0" / "address").write_text("127.0.0.1:1\n")
    assert live_addresses(tmp_path, 2) == []  # shard 1 not up yet
    (tmp_path / "sync-1" / "address").write_text("127.0.0.1:2\n")
    assert live_addresses(tmp_path, 2) == ["127.0.0.1:1", "127.0.0.1:2"]
    (tmp_path / "sync-1" / "address").write_text("127.0.0.1:3\n")  # its job requeued: a new port
    assert live_addresses(tmp_path, 2)[1] == "127.0.0.1:3"


def test_a_shard_that_does_not_answer_is_left_out(tmp_path):
    (tmp_path / "sync-0").mkdir()
    (tmp_path / "sync-0" / "address").write_text("127.0.0.1:9\n")  # nothing listens on port 9
    began = time.monotonic()
    assert live_statuses(tmp_path, 1, None) == []
    assert time.monotonic() - began < 10.0


def test_a_run_without_a_checkpoint_still_records_and_says_why(tmp_path, shakespeare):
    config = RunConfig(
        run_dir=tmp_path / "run", learners=2, data=shakespeare, model_size="tiny", seq_len=16, tokens=1000
    )
    rec = SlurmRecord(config, time.time())
    assert json.loads((config.run_dir / "config.json").read_text())["clock_origin"] == rec.start_wall
    result, error = rec.finish(1.0)
    assert error and "could not evaluate the final checkpoint" in error
    assert math.isnan(result["eval_loss"]) and result["goodput"] == 0.0 and result["learner_restarts"] == 0
    assert json.loads((config.run_dir / "summary.json").read_text())["run_dir"] == str(config.run_dir)
    last = (config.run_dir / "metrics.jsonl").read_text().splitlines()[-1]
    assert json.loads(last)["kind"] == "eval"


def test_a_followed_run_sends_its_records_to_the_metric_sinks_and_closes_them(tmp_path, shakespeare):
    """`--tensorboard` / `--wandb` on `ddiloco run --backend slurm`: the sinks get what metrics.jsonl gets."""

    class ListSink:
        def __init__(self) -> None:
            self.rows: list[tuple[str, float, dict]] = []
            self.closed = False

        def write(self, kind: str, tokens: float, values: dict) -> None:
            self.rows.append((kind, tokens, values))

        def close(self) -> None:
            self.closed = True

    config = RunConfig(
        run_dir=tmp_path / "run",
        learners=2,
        data=shakespeare,
        model_size="tiny",
        seq_len=16,
        tokens=1000,
        eval_every=0.0,
    )
    sink = ListSink()
    rec = SlurmRecord(config, time.time())
    rec.start([sink])
    rec.finish(1.0)
    logged = [json.loads(line) for line in (config.run_dir / "metrics.jsonl").read_text().splitlines()]
    assert sink.closed and [kind for kind, _, _ in sink.rows] == [m["kind"] for m in logged]
    assert sink.rows[-1][0] == "eval" and math.isnan(sink.rows[-1][2]["eval_loss"])  # no checkpoint: NaN
