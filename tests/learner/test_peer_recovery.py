"""Peer recovery of the inner state (issue 12): a learner that starts on an empty disk takes the AdamW
moments and step of a live learner, checked by checksum at both ends, and its contributions are
accepted; a donor killed with kill -9 mid-transfer makes the joiner ask another, never hang."""

from __future__ import annotations

import json
import os
import re
import signal

import pytest

from ..support.processes import (
    start_learner,
    start_synchronizer,
    status,
    stop_run,
    wait_exit,
)
from ..support.runtime import wait_for

DONATED = re.compile(r"donated the inner state \(\d+ tensors, [\d.]+ MB, checksum ([0-9a-f]{64})\)")
TOOK = re.compile(r"learner 2 took its inner state from learner (\d) \(step (\d+), checksum ([0-9a-f]{64})\)")


@pytest.mark.timeout(240)
def test_empty_learner_recovers_a_peers_inner_state_even_when_the_first_donor_dies_mid_transfer(
    procs, tmp_path, shakespeare
):
    sync, address = start_synchronizer(
        procs, tmp_path, shakespeare, 3, 0, "--tokens", str(10**9), "--chunk-bytes", "8192", "--heartbeat", "1.0"
    )
    # slow donors: each 8 KB frame of a donation waits 200 ms, so an upload takes about 8 s and can be
    # cut short even on a loaded machine (a 1 s heartbeat gives it a 24 s drain to finish in)
    donors = {
        m: start_learner(
            procs, tmp_path, shakespeare, 3, address, m, "--net-delay", "200", "--min-step-seconds", "0.03"
        )
        for m in range(2)
    }
    wait_for(
        lambda: all(status(address).get("learners", {}).get(str(m), {}).get("step", 0) >= 20 for m in range(2)),
        120,
        message="both donors to train",
    )
    joiner = start_learner(procs, tmp_path, shakespeare, 3, address, 2, "--json")  # learner-2/ is empty

    def uploading() -> dict | None:
        tickets = status(address).get("donations", {}).get("open", {}).values()
        return next((t for t in tickets if t["state"] == "uploading"), None)

    first = wait_for(uploading, 60, message="a donation under way")["donor"]
    os.kill(donors[first].pid, signal.SIGKILL)
    log = tmp_path / "learner-2" / "stderr.log"
    took = wait_for(lambda: TOOK.search(log.read_text()), 90, message="the joiner to take a donated state")
    donor, step = int(took.group(1)), int(took.group(2))
    assert donor != first and donor in donors and step > 0
    donated = DONATED.findall((tmp_path / f"learner-{donor}" / "stderr.log").read_text())
    assert took.group(3) in donated  # the joiner holds exactly the moments the donor snapshotted
    wait_for(
        lambda: status(address).get("books", {}).get("2", {}).get("contributions", 0) >= 2,
        60,
        message="the joiner's contributions",
    )
    final = status(address)
    assert final["donations"]["donated"] >= 1 and final["donations"]["failed"] >= 1
    stop_run(address)
    assert wait_exit([joiner, donors[donor], sync], 60) == [0, 0, 0]
    stats = json.loads((tmp_path / "learner-2" / "stdout.log").read_text().strip().splitlines()[-1])
    assert stats["recovered"]["donor"] == donor and stats["recovered"]["attempts"] >= 2
    assert stats["accepted"] >= 1
