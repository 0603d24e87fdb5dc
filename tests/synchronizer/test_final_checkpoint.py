"""A synchronizer whose final checkpoint cannot be written (its disk vanished or filled) still exits on
SIGTERM, with a non-zero status and the reason, instead of hanging on its learners' open streams."""

from __future__ import annotations

import os
import signal

import pytest

from ..support.processes import start_learner, start_synchronizer, status, wait_exit
from ..support.runtime import wait_for

pytestmark = pytest.mark.timeout(120)


def test_a_failed_final_checkpoint_ends_the_process_with_the_reason(procs, tmp_path, shakespeare):
    checkpoints = tmp_path / "checkpoints"
    checkpoints.mkdir()
    sync, address = start_synchronizer(procs, tmp_path, shakespeare, 1, 0, "--checkpoint-dir", str(checkpoints))
    # a short grace: after SIGTERM the learner cannot reach the synchronizer, which has ended
    learner = start_learner(procs, tmp_path, shakespeare, 1, address, 0, "--term-grace", "3")
    wait_for(lambda: status(address).get("learners"), 60, message="the learner to join (its update stream open)")
    checkpoints.rename(tmp_path / "moved")  # atomic, unlike a removal racing the checkpoint writer
    os.kill(sync.pid, signal.SIGTERM)
    assert wait_exit([sync], 40) == [1]
    assert "final checkpoint could not be written" in (tmp_path / "sync" / "stderr.log").read_text()
    os.kill(learner.pid, signal.SIGTERM)
    assert wait_exit([learner], 60)[0] is not None
