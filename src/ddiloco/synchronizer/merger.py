"""Merges computed off the service lock, several fragments at once.

The core closes a round under the service lock and hands out a `MergeDue`; the tensor work (the
merged direction over every contribution and the outer step's finiteness check) runs here, in a
pool of threads (torch releases the GIL), while heartbeats, registrations and other fragments'
contributions are served. The result goes back through `finish`, which takes the lock only to
apply the step and send the update.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

from ..core.merge_job import MergeJob, MergeResult

log = logging.getLogger(__name__)

Finish = Callable[[MergeJob, MergeResult, float], None]


class MergeWorkers:
    def __init__(self, finish: Finish, threads: int) -> None:
        """`finish(job, result, seconds_since_due)` runs in the worker thread, which holds no lock."""
        self._finish = finish
        self._pool = ThreadPoolExecutor(max_workers=max(1, threads), thread_name_prefix="ddiloco-merge")

    def submit(self, job: MergeJob) -> None:
        try:
            self._pool.submit(self._run, job, time.perf_counter())
        except RuntimeError:  # closed: a round that came due while the last merges finished stays open
            log.info("merge of fragment %d version %d not started: stopping", job.fragment, job.version)

    def _run(self, job: MergeJob, due: float) -> None:
        try:
            result = job.compute()
        except Exception as exc:  # a bug must not leave the fragment busy forever: the round is refused
            log.exception("merge of fragment %d version %d failed", job.fragment, job.version)
            result = MergeResult({}, 0.0, f"the merge failed: {type(exc).__name__}: {exc}")
        try:
            self._finish(job, result, time.perf_counter() - due)
        except Exception:
            log.exception("finishing the merge of fragment %d version %d failed", job.fragment, job.version)

    def close(self) -> None:
        """Finish the merges already due (their results are applied), then stop."""
        self._pool.shutdown(wait=True)
