"""A data-parallel run sends metrics.jsonl's numbers to the metric sinks too (`--tensorboard`, `--wandb`
on `ddiloco run --method ddp`): the same kinds, tokens and values, and the sinks are closed at the end."""

from __future__ import annotations

import json
from pathlib import Path

from ddiloco.dataparallel.config import DataParallelConfig
from ddiloco.dataparallel.run import run_data_parallel
from ddiloco.train.inner import InnerConfig

from .runs import BATCH, LIMIT, SEQ, TOKENS_PER_WORKER_STEP


class ListSink:
    """A sink that keeps what it is given (the protocol of `records.sinks.Sink`)."""

    def __init__(self) -> None:
        self.rows: list[tuple[str, float, dict[str, float]]] = []
        self.closed = False

    def write(self, kind: str, tokens: float, values: dict[str, float]) -> None:
        self.rows.append((kind, tokens, dict(values)))

    def close(self) -> None:
        self.closed = True


def test_the_sinks_get_every_eval_record_of_metrics_jsonl(tmp_path: Path, shakespeare: str):
    sink = ListSink()
    config = DataParallelConfig(
        run_dir=tmp_path / "run",
        model_size="tiny",
        data=shakespeare,
        seq_len=SEQ,
        workers=2,
        inner=InnerConfig(batch_size=BATCH),
        tokens=2 * TOKENS_PER_WORKER_STEP * 30,
        checkpoint_every=10,
        eval_every=0.5,
        eval_batches=4,
        learner_down=1.0,
        collective_timeout=20.0,
        time_limit=LIMIT - 20,
    )
    result = run_data_parallel(config, sinks=[sink])
    assert result["error"] is None and sink.closed
    logged = [json.loads(line) for line in (config.run_dir / "metrics.jsonl").read_text().splitlines()]
    evals = [m for m in logged if m["kind"] == "eval"]
    assert evals and evals[-1]["eval_loss"] == result["eval_loss"]  # at least the final evaluation
    sent = [(tokens, values["eval_loss"]) for kind, tokens, values in sink.rows if kind == "eval"]
    assert sent == [(m["tokens"], m["eval_loss"]) for m in evals]
