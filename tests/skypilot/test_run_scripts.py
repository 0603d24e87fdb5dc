"""The tasks' `run:` scripts run for real on this machine, as SkyPilot would run them on its nodes
(bash, the task's envs and secrets, SKYPILOT_* variables, mounts read from their local sources), over
TLS on 127.0.0.1: the synchronizer task and two learner jobs; one learner's process is killed with
kill -9 and its script started again as SkyPilot's job_recovery does (a new task on a new node, the
same run directory on the store); a shard's process is killed and its task restarts it from its
checkpoint. The learner recovers and rejoins, every token is accounted, and the run ends cleanly.

Without SkyPilot, in seconds; test_sky_e2e.py runs the same through SkyPilot itself on a local Slurm
cluster (slow, and only where tools/skypilot_local.sh has set that up)."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
from pathlib import Path

import pytest

from ddiloco.cluster import skypilot as sky
from ddiloco.learner.journal import read_journals

from ..support.runtime import wait_for
from .tasks import TOKEN, dry_run, load, node_env, start

TOKENS_PER_STEP = 4 * 16


def free_port() -> int:
    """A port p with p and p + 100 free (the shard's gRPC and bulk socket), from a range tests keep to."""
    for port in range(21070, 21900, 7):
        with contextlib.ExitStack() as stack:
            try:
                for p in (port, port + 100):
                    s = stack.enter_context(socket.socket())
                    s.bind(("127.0.0.1", p))
            except OSError:
                continue
            return port
    raise RuntimeError("no free port pair")


def journals(run: Path, m: int) -> list[dict]:
    return [j for j in read_journals(run / f"learner-{m}", "journal-*.json") if j]


def shard_pid(run: Path) -> int | None:
    want = str(run / "sync-0").encode()
    for entry in Path("/proc").iterdir():
        try:
            args = (entry / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if b"synchronizer" in args and b"--checkpoint-dir" in args and want in args:
            return int(entry.name)
    return None


@pytest.mark.slow  # a whole run on the virtual clock or in processes: minutes under load on 2 cores
@pytest.mark.timeout(300)
def test_a_killed_learner_job_recovers_and_rejoins_and_every_token_is_accounted(tmp_path, shakespeare):
    run, port = tmp_path / "run", free_port()
    budget = 2 * 260 * TOKENS_PER_STEP
    # --store: a path every node sees (a shared home on a Slurm cluster); TLS forced on, as beyond a private network
    tasks = dry_run(
        run,
        *("--store", str(run), "--sync-host", "127.0.0.1", "--tls", "--sky-port", str(port), "--learners", "2"),
        *("--model-size", "tiny", "--seq-len", "16", "--data", shakespeare, "--batch-size", "4", "--fragments", "2"),
        *("--sync-every", "4", "--heartbeat", "0.2", "--threads", "1", "--min-step-seconds", "0.04"),
        *("--tokens", str(budget), "--term-grace", "5"),
    )["tasks"]
    tasks = {role: load(path) for role, path in tasks.items()}
    ca = run / "skypilot" / "tls-ca" / "ca.pem"

    def status() -> dict:
        try:
            return sky.status(f"127.0.0.1:{port}", TOKEN, ca, timeout=2.0)
        except ConnectionError:
            return {}

    def contributions(m: int) -> int:
        return status().get("books", {}).get(str(m), {}).get("contributions", 0)

    procs = {}
    try:
        env = node_env(tasks["sync"], "sky-sync-1", {"DDILOCO_STATE": str(tmp_path / "sync-node")})
        procs["sync"] = start(tasks["sync"], env, tmp_path / "sync.log")
        for m in range(2):
            task = tasks[f"learner{m}"]
            procs[m] = start(task, node_env(task, f"sky-managed-{m}_0", {}), tmp_path / f"learner{m}.log")
        published = run / "sync-0" / "address"

        def alive_and(condition):  # noqa: ANN001, ANN202 (fail at once, with its log, when a task's script died)
            def check():  # noqa: ANN202
                for role, proc in procs.items():
                    assert proc.poll() is None, (
                        tmp_path / f"{role if role == 'sync' else f'learner{role}'}.log"
                    ).read_text()[-3000:]
                return condition()

            return check

        wait_for(
            alive_and(lambda: published.is_file() and published.read_text().strip()),
            120,
            message="the published address",
        )
        assert published.read_text().strip() == f"127.0.0.1:{port}"
        wait_for(
            alive_and(lambda: all(contributions(m) >= 2 for m in range(2))), 120, message="both learners to contribute"
        )
        before = contributions(1)
        os.kill(procs[1].pid, signal.SIGKILL)  # the script exec'd the learner: this is its process
        assert procs[1].wait(10) == -signal.SIGKILL
        task = tasks["learner1"]  # job_recovery: the same task again, on a new node
        procs[1] = start(task, node_env(task, "sky-managed-1_1", {}), tmp_path / "learner1.log")
        wait_for(lambda: len(journals(run, 1)) >= 2, 60, message="the recovered learner's new process")
        wait_for(alive_and(lambda: contributions(1) >= before + 2), 120, message="the recovered learner to contribute")
        pid = wait_for(lambda: shard_pid(run), 10, message="the shard's process")
        killed = status()["version_sum"]
        os.kill(pid, signal.SIGKILL)  # its task restarts it from its checkpoint, on the same port
        wait_for(
            lambda: status().get("restored_from") is not None and status()["version_sum"] >= killed + 2,
            120,
            message="the shard restarted from its checkpoint and merging again",
        )
        assert procs["sync"].wait(180) == 0, (tmp_path / "sync.log").read_text()[-3000:]
        for m in range(2):
            assert procs[m].wait(60) == 0, (tmp_path / f"learner{m}.log").read_text()[-3000:]
    finally:
        for proc in procs.values():
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(10)
    final = json.loads((run / "sync-0" / "summary.json").read_text())
    assert final["finished"] and final["double_merged_steps"] == 0 and final["tokens_reported"] >= budget
    first, second = sorted(journals(run, 1), key=lambda j: j["started"])[:2]
    assert first["incarnation"] != second["incarnation"] and second["start_position"] <= first["position"]
    log = (run / "sync-0" / "task.log").read_text()
    assert "restart 1 from its checkpoint" in log
    trained = 0
    for m in range(2):
        for j in journals(run, m):
            assert j["tokens"] == (j["position"] - j["start_position"]) * TOKENS_PER_STEP
            trained += j["tokens"]
        assert final["books"][str(m)]["tokens_merged"] <= sum(j["tokens"] for j in journals(run, m))
    assert 0 < final["tokens_merged"] <= trained and final["tokens_reported"] <= trained
    for path in [*run.rglob("*.yaml"), *run.rglob("*.sh"), *tmp_path.glob("*.sh")]:
        assert TOKEN not in path.read_text()  # the token only ever in the environment and the 0600 file
