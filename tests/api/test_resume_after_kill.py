"""Issue 11's acceptance: a learner killed with kill -9 and restarted with `ResumableSampler` resumes at
the exact sample after its last counted contribution: nothing counted is trained again, nothing
skipped (real processes, a DataLoader worker, kill -9)."""

from __future__ import annotations

import contextlib
import itertools
import json
import sys
from pathlib import Path

import pytest

import ddiloco

from ..support import sampler_learner
from ..support.runtime import wait_for

SCRIPT = Path(sampler_learner.__file__)


def lines(path: Path) -> list[dict]:
    out = []
    for line in path.read_text().splitlines() if path.is_file() else []:
        with contextlib.suppress(json.JSONDecodeError):  # the killed process's last line may be torn
            out.append(json.loads(line))
    return out


def restarted_steps(records: list[dict]) -> int:
    """Steps the restarted process has logged (0 before it logs any). One pass over what was read: this
    runs in the process that hosts the synchronizer, and a poll that read the log again for every line
    (quadratic) held its threads off for minutes on a loaded machine: heartbeats and registrations timed
    out, the learner was declared gone again and again, and trained on alone while the log grew."""
    if len({r["incarnation"] for r in records}) != 2:
        return 0
    return sum(1 for r in records if r["incarnation"] == records[-1]["incarnation"])


@pytest.mark.timeout(180)
def test_killed_learner_resumes_at_the_sample_after_its_counted_work(procs, tmp_path):
    sync = ddiloco.Synchronizer(
        sampler_learner.model(), learners=2, sync_every=4, overlap=1, quorum=1, grace=0.0, heartbeat=0.1
    )
    address = sync.start()
    try:
        log = tmp_path / "trained.jsonl"

        def start():
            return procs.start(
                "learner",
                [sys.executable, str(SCRIPT), address, "1", str(log)],
                tmp_path / "learner.stderr",
                tmp_path / "learner.stdout",
            )

        first = start()
        wait_for(
            lambda: sync.status()["books"].get("1", {}).get("merged_position", 0) >= 12,
            90,
            message="counted work of the first process",
        )
        procs.kill_tree(first)  # kill -9, then its DataLoader worker and forkserver (orphans otherwise)
        counted = sync.status()["books"]["1"]["merged_position"]
        second = start()
        wait_for(lambda: restarted_steps(lines(log)) >= 5, 90, message="steps of the restarted process")
        ddiloco.stop_run(address)
        assert wait_for(lambda: second.poll() is not None, 60, message="the learner to exit") is not None
    finally:
        sync.stop()
    records = lines(log)
    old, new = [[r for r in records if r["incarnation"] == i] for i in dict.fromkeys(r["incarnation"] for r in records)]
    resume = new[0]["position"] - 1  # where the synchronizer told the new process to start
    assert 12 <= counted <= resume <= len(old)  # at least what was counted when it was killed
    assert sync.status()["double_merged_steps"] == 0
    expected = ddiloco.ResumableSampler(sampler_learner.N, 1, 2, batch_size=sampler_learner.BATCH, seed=3)
    stream = list(itertools.islice(iter(expected), (resume + len(new)) * sampler_learner.BATCH))
    batches = [stream[i : i + sampler_learner.BATCH] for i in range(0, len(stream), sampler_learner.BATCH)]
    assert [r["indices"] for r in old[:resume]] == batches[:resume]  # the counted work: nothing skipped
    assert [r["indices"] for r in new] == batches[resume:]  # the new process reads on from there: nothing twice
