"""Eval loss of the job's model, read from its checkpoints: the newest one now and then during the
run (for loss against wall time, as `launch.metrics` does for the global model), the final one at
the end. The launcher reads; only rank 0 writes checkpoints."""

from __future__ import annotations

import logging
import threading
import time
from pathlib import Path

from ..launch.evaluate import evaluate_params
from ..records.rundir import MetricsLog
from ..train.tasks import Task
from .checkpoint import load_params

log = logging.getLogger(__name__)


def evaluate_checkpoint(task: Task, seed: int, directory: Path, batches: int) -> tuple[dict[str, float], dict] | None:
    """(metrics, manifest) of the newest checkpoint, or None when there is none yet."""
    found = load_params(directory)
    if found is None:
        return None
    params, manifest = found
    return evaluate_params(task, seed, params, batches), manifest


class CheckpointEvaluator:
    """Every `every` seconds, the eval loss of the newest checkpoint if it is new (a thread)."""

    def __init__(
        self, task: Task, seed: int, directory: Path, metrics: MetricsLog, every: float, origin: float, batches: int
    ) -> None:
        self.task, self.seed, self.directory, self.metrics = task, seed, directory, metrics
        self.every, self.origin, self.batches = every, origin, batches
        self.seen = -1
        self.stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="ddiloco-dp-eval", daemon=True)

    def start(self) -> None:
        if self.every > 0:
            self._thread.start()

    def _loop(self) -> None:
        while not self.stop.wait(self.every):
            try:
                found = evaluate_checkpoint(self.task, self.seed, self.directory, self.batches)
            except (OSError, ValueError, KeyError, RuntimeError) as exc:  # replaced while read: next time
                log.debug("checkpoint not evaluated: %s", exc)
                continue
            if found is not None and found[1]["lineage"]["step"] != self.seen:
                values, manifest = found
                self.seen = manifest["lineage"]["step"]
                # stamped with the time its model was made (its last step), as the runtime stamps the
                # global model with when it fetched it: not with when this thread got round to it
                made = float(manifest["lineage"].get("last_commit") or time.time())
                self.metrics.write("eval", made - self.origin, manifest["lineage"]["tokens_merged"], **values)

    def close(self) -> None:
        self.stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=60)
