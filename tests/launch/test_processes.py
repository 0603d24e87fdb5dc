"""Real processes over loopback: kill -9 a learner, kill -9 the synchronizer; the run goes on."""

import os
import signal
import sys
import time

import pytest

from ddiloco.launch.procs import ProcessTable
from ddiloco.records.atomic import read_json
from ddiloco.records.events import read_events

from ..support.processes import (
    TOKENS_PER_STEP,
    events,
    journals,
    start_learner,
    start_synchronizer,
    status,
    stop_run,
    wait_exit,
)
from ..support.runtime import wait_for


@pytest.mark.slow  # kill -9 of learners stays in the default suite (tests/launch/test_run.py)
@pytest.mark.timeout(150)
def test_killed_learner_is_not_waited_for_rejoins_and_every_token_is_accounted(procs, tmp_path, shakespeare):
    sync, address = start_synchronizer(procs, tmp_path, shakespeare, 3)
    learners = {m: start_learner(procs, tmp_path, shakespeare, 3, address, m) for m in range(3)}
    wait_for(
        lambda: all(status(address).get("books", {}).get(str(m), {}).get("contributions", 0) > 0 for m in range(3)),
        90,
        message="every learner to contribute",
    )
    os.kill(learners[1].pid, signal.SIGKILL)
    killed_at = status(address)
    wait_for(lambda: 1 not in status(address).get("live", [1]), 15, message="learner 1 to be declared gone")
    # the global model keeps advancing without it
    wait_for(
        lambda: status(address)["version_sum"] >= killed_at["version_sum"] + 4,
        30,
        message="merges while learner 1 is down",
    )
    gone = status(address)
    assert 1 not in gone["live"] and gone["version_sum"] > killed_at["version_sum"]

    learners[1] = start_learner(procs, tmp_path, shakespeare, 3, address, 1)
    before = status(address)["books"]["1"]["contributions"]
    wait_for(
        lambda: status(address)["books"]["1"]["contributions"] >= before + 2,
        60,
        message="the restarted learner to contribute again",
    )
    stop_run(address)
    codes = wait_exit([*learners.values(), sync], 60)
    assert codes == [0, 0, 0, 0], codes

    joins = [e for e in events(tmp_path) if e["kind"] == "join" and e["learner"] == 1]
    assert len({e["incarnation"] for e in joins}) == 2
    first, second = sorted(journals(tmp_path, 1), key=lambda j: j["started"])
    resume = [e for e in joins if e["incarnation"] == second["incarnation"]][0]["resume_position"]
    # the new process resumed its data where its last counted contribution left it: no batch twice
    assert second["start_position"] == resume
    assert 0 < resume <= first["position"]
    final = read_json(tmp_path / "sync" / "summary.json")
    assert final["double_merged_steps"] == 0
    trained = 0
    for m in range(3):
        for j in journals(tmp_path, m):  # each process's tokens match the data it read
            assert j["tokens"] == (j["position"] - j["start_position"]) * TOKENS_PER_STEP
            trained += j["tokens"]
    assert final["tokens_reported"] <= trained
    assert 0 < final["tokens_merged"] <= trained
    for m in range(3):
        book = final["books"][str(m)]
        assert book["tokens_merged"] <= sum(j["tokens"] for j in journals(tmp_path, m))


@pytest.mark.timeout(150)
def test_killed_synchronizer_restarts_from_its_checkpoint_on_a_new_port_and_learners_follow(
    procs, tmp_path, shakespeare
):
    sync, address = start_synchronizer(procs, tmp_path, shakespeare, 2)
    # learners know the synchronizer only by its address file (as on Slurm, where a requeued shard moves)
    spec = f"@{tmp_path / 'sync' / 'address'}"
    learners = [start_learner(procs, tmp_path, shakespeare, 2, spec, m) for m in range(2)]
    wait_for(
        lambda: (
            status(address).get("merges", 0) >= 6
            and all(status(address).get("books", {}).get(str(m), {}).get("contributions", 0) > 0 for m in range(2))
        ),
        90,
        message="merges with both learners",
    )
    os.kill(sync.pid, signal.SIGKILL)
    sync.popen.wait(10)
    steps_at_kill = {m: max(j["steps"] for j in journals(tmp_path, m)) for m in range(2)}
    time.sleep(1.5)
    held = [max(v) for m in range(2) for j in journals(tmp_path, m) for v in [j["versions"]]]
    committed = {int(p): e["version"] for p, e in read_json(tmp_path / "sync" / "manifest.json")["fragments"].items()}
    # learners kept training while the synchronizer was down
    for m in range(2):
        assert max(j["steps"] for j in journals(tmp_path, m)) > steps_at_kill[m] + 5
        assert learners[m].alive()
    # every version any learner ever received was durable before it was sent
    for m in range(2):
        for j in journals(tmp_path, m):
            assert all(v <= committed[p] for p, v in enumerate(j["versions"]))

    first = address
    sync, address = start_synchronizer(procs, tmp_path, shakespeare, 2)
    assert address != first  # a new port: learners must read the file again
    # what it restored, from its own record: learners may already have merged again by a status call
    [restored] = [e for e in read_events(tmp_path / "sync" / "events.jsonl") if e["kind"] == "restored"]
    assert {int(p): v for p, v in restored["versions"].items()} == committed
    assert status(address)["restored_from"] is not None
    # both learners reconnect by themselves and the global model advances again
    wait_for(lambda: sorted(status(address).get("live", [])) == [0, 1], 30, message="both learners to reconnect")
    wait_for(
        lambda: status(address).get("version_sum", 0) >= sum(committed.values()) + 4,
        60,
        message="merges after the restart",
    )
    stop_run(address)
    assert wait_exit([*learners, sync], 60) == [0, 0, 0]
    assert held  # journals were read
    for m in range(2):
        log = (tmp_path / f"learner-{m}" / "stderr.log").read_text()
        assert "moved from" in log and "older than our" not in log  # followed the file; nobody dragged back


def test_kill_tree_ends_the_child_and_the_processes_it_started(tmp_path):
    table = ProcessTable()
    pid_file = tmp_path / "grandchild"
    # the child starts a grandchild in its own session (as a forkserver would) and sleeps
    code = (
        "import subprocess, sys, time; p = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)'], "
        f"start_new_session=True); open({str(pid_file)!r}, 'w').write(str(p.pid)); time.sleep(60)"
    )
    child = table.start("parent", [sys.executable, "-c", code])
    deadline = time.monotonic() + 30
    while not (pid_file.is_file() and pid_file.read_text()) and time.monotonic() < deadline:
        time.sleep(0.05)
    grandchild = int(pid_file.read_text())
    table.kill_tree(child)
    assert child.poll() == -9
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        try:
            state = open(f"/proc/{grandchild}/stat").read().rsplit(")", 1)[1].split()[0]
        except OSError:
            break  # gone
        if state == "Z":
            break  # killed, waiting for init to reap it
        time.sleep(0.05)
    else:
        os.kill(grandchild, 9)
        raise AssertionError("the grandchild outlived kill_tree")
