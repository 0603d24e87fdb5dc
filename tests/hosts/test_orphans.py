"""A learner knows when to stop, across hosts (issue 46): each process on its own network namespace,
links shaped by the kernel, real partitions and a real kill -9.

- a partition across the end of the run: the run finishes while learner 0 is cut off; both learners
  end by themselves within the bound (at most S x H steps alone, then no longer than the orphan
  timeout, or at once on the finished shard's mark), each with its summary line, and the books hold
  (no step merged twice, merged <= trained, the budget merged). Before the fix learner 0 came back to
  a closed port and trained alone until killed.
- a synchronizer that never comes back (kill -9, no restart): the learner ends within its orphan
  timeout, exit 3, summary printed, journal kept.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from ddiloco.learner.ending import EXIT_ORPHANED
from ddiloco.records.atomic import read_json
from ddiloco.wire import runend

from ..support.processes import journals
from ..support.runtime import wait_for
from .cluster import FAILURE, STEP_S, SYNC_EVERY, Cluster, names
from .test_partitions import check_books

LINK = "rate=20mbit,latency=5ms"  # the held-out run's learner links
TOKENS_PER_STEP = 4 * 16  # --batch-size 4, --seq-len 16
SOLO = 4 * SYNC_EVERY  # S x H with the default --max-staleness 4


def _summary(cluster: Cluster, m: int) -> dict:
    text = (cluster.tmp / f"learner-{m}" / "stderr.log").read_text()
    lines = [ln for ln in text.splitlines() if ln.startswith('{"learner"')]
    assert lines, f"learner {m} printed no summary line:\n{text[-2000:]}"
    return json.loads(lines[-1])


def _exit(proc, timeout: float, what: str, log: Path) -> int:
    try:
        return proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        tail = log.read_text()[-2000:]
        raise AssertionError(f"{what} did not end by itself within {timeout:.0f} s:\n{tail}") from None


@pytest.mark.timeout(240)
@pytest.mark.parametrize("connect", ["address file", "host:port"])
def test_a_partition_across_the_end_of_the_run(make_network, tmp_path, shakespeare, connect):
    # "address file": learner 0 reads the finished shard's mark and ends at once (its 300 s are far off).
    # "host:port" (the held-out run): no mark to read; it ends 10 s after its synchronizer's last answer.
    # Either way it trains at most S x H steps alone, then waits without training. Learner 1 carries the
    # rest of the budget alone, at least 10 s of steps at STEP_S.
    by_file = connect == "address file"
    net = make_network(names(2, 1), LINK)
    budget = 250 * TOKENS_PER_STEP
    orphan = 300.0 if by_file else 10.0
    c = Cluster(
        net,
        tmp_path,
        shakespeare,
        tokens=budget,
        by_file=by_file,
        learner_args=("--json", "--orphan-timeout", str(orphan)),
    )
    c.wait_merged(0)
    # a merge can come before the learner's first journal is written: wait for one (seen empty once)
    before = max(j["steps"] for j in wait_for(lambda: journals(tmp_path, 0), 60, message="learner 0's journal"))
    net.cut("learner0", "both")
    sync_code = _exit(c.sync[0], 180, "the synchronizer", c.sync_dir(0) / "stderr.log")
    net.heal("learner0")  # back to a closed port, if it is still running
    assert sync_code == 0
    logs = [tmp_path / f"learner-{m}" / "stderr.log" for m in range(2)]
    codes = [_exit(p, 60, f"learner {m}", logs[m]) for m, p in enumerate(c.learner_procs)]
    s0, s1 = _summary(c, 0), _summary(c, 1)
    assert codes[1] == s1["exit_code"] == 0, s1
    summary = read_json(c.sync_dir(0) / "summary.json")
    check_books(c, [summary])
    assert summary["tokens_merged"] >= 0.75 * budget, summary["tokens_merged"]  # learner 1 carried the run
    assert codes[0] == s0["exit_code"] and codes[0] in (0, EXIT_ORPHANED), s0
    # steps never come faster than STEP_S (load only slows them): S x H alone, and those before it noticed
    assert s0["steps"] - before <= SOLO + FAILURE / STEP_S + 5, (s0["steps"], before)
    (journal,) = journals(tmp_path, 0)  # kept on disk, with every step it trained
    assert journal["steps"] == s0["steps"]
    if by_file:
        mark = runend.read(c.sync_dir(0) / "address")
        assert mark is not None and "finished" in s0["ended"], s0
        counted = runend.counted_position(mark, 0)
        assert codes[0] == (0 if counted >= s0["position"] else EXIT_ORPHANED)
    else:
        assert codes[0] == EXIT_ORPHANED and "orphan timeout" in s0["ended"], s0


@pytest.mark.timeout(180)
def test_a_synchronizer_that_never_comes_back(make_network, tmp_path, shakespeare):
    net = make_network(names(1, 1), LINK)
    orphan = 6.0
    c = Cluster(
        net,
        tmp_path,
        shakespeare,
        learners=1,
        duration=600,
        sync_args=("--max-staleness", "1000"),  # S x H = 4000 steps: the orphan timeout ends it
        learner_args=("--json", "--orphan-timeout", str(orphan)),
    )
    c.wait_merged(0)
    # a merge can come before the learner's first journal is written: wait for one (seen empty once)
    before = max(j["steps"] for j in wait_for(lambda: journals(tmp_path, 0), 60, message="learner 0's journal"))
    c.sync[0].kill()  # kill -9, no restart
    c.sync[0].wait(timeout=30)
    code = _exit(c.learner_procs[0], 120, "learner 0", tmp_path / "learner-0" / "stderr.log")
    assert code == EXIT_ORPHANED
    s = _summary(c, 0)
    assert s["exit_code"] == EXIT_ORPHANED and "orphan timeout" in s["ended"], s
    (journal,) = journals(tmp_path, 0)  # kept, saying it was orphaned, with every step it trained
    assert journal["state"] == "orphaned" and journal["steps"] == s["steps"]
    # alone no longer than its bound: steps never come faster than STEP_S (load only slows them), and
    # it stops at most one step after the orphan timeout counted from its last answer
    assert s["steps"] - before <= (orphan + FAILURE) / STEP_S + 5, (s["steps"], before)
