"""End to end, for real: `ddiloco run --backend skypilot` through SkyPilot's Slurm infra on the local
Slurm cluster that tools/skypilot_local.sh sets up (its login node an sshd on 127.0.0.1). Two learners
as managed jobs; one learner's Slurm allocation is cancelled with `scancel` (a preemption); SkyPilot
notices, recovers the job (RECOVERING, then RUNNING on a new allocation) and the learner rejoins; the
run reaches its budget, every token is accounted and the launcher ends the jobs and the cluster.

Slow (about 15 minutes on 2 busy cores: every SkyPilot cluster on Slurm takes minutes to provision).
Skips, saying why, unless `bash tools/skypilot_local.sh setup` has run (its environment file, the
SkyPilot venv, its sshd and Slurm cluster alive). Everything it starts it ends: the launcher by its
PID (SIGTERM: the run's own clean stop, which cancels the jobs and takes the cluster down), then,
should anything be left, those jobs by their IDs and the cluster and Slurm jobs by their names."""

from __future__ import annotations

import contextlib
import json
import os
import re
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from ddiloco.cluster import skypilot as sky
from ddiloco.learner.journal import read_journals

from .test_run_scripts import TOKENS_PER_STEP, free_port, journals

ENV_FILE = Path(os.environ.get("DDILOCO_SKY_ENV_FILE", "/tmp/ddiloco-sky-local.env"))
TOKEN = "sky-e2e-token"
STATUS = re.compile(
    r"^\s*(\d+)\s+.*\s(\d+)\s+(PENDING|SUBMITTED|STARTING|RUNNING|RECOVERING|CANCELLING|SUCCEEDED|CANCELLED|FAILED\w*)\b"
)


def local_setup() -> dict[str, str]:
    """The environment tools/skypilot_local.sh wrote, checked; skips the test when something is missing."""
    if not ENV_FILE.is_file():
        pytest.skip(f"no {ENV_FILE}: run `bash tools/skypilot_local.sh setup` first (root, Slurm, sshd, SkyPilot)")
    env: dict[str, str] = {}
    for line in ENV_FILE.read_text().splitlines():
        for word in shlex.split(line, comments=True)[1:] if line.startswith("export ") else []:
            key, _, value = word.partition("=")
            env[key] = value.replace("$PATH", os.environ.get("PATH", ""))
    venv, slurm, pid_file = (
        env.get(k, "") for k in ("DDILOCO_SKY_VENV", "DDILOCO_SKY_SLURM_DIR", "DDILOCO_SKY_SSHD_PID")
    )
    if not Path(venv, "bin", "sky").is_file():
        pytest.skip(f"SkyPilot is not in {venv!r}: run `bash tools/skypilot_local.sh setup`")
    try:
        os.kill(int(Path(pid_file).read_text().split()[0]), 0)
    except (OSError, ValueError):
        pytest.skip(f"the login node's sshd ({pid_file}) is not running: run `bash tools/skypilot_local.sh setup`")
    sinfo = subprocess.run(["sinfo", "-h"], env={**os.environ, **env}, capture_output=True, timeout=30)
    if not Path(slurm, "pids.json").is_file() or sinfo.returncode != 0:
        pytest.skip(f"the local Slurm cluster in {slurm!r} is not up: run `bash tools/skypilot_local.sh setup`")
    return env


def sky_jobs(env: dict[str, str]) -> dict[str, tuple[str, int]]:
    """`sky jobs queue` as {job ID: (status, recoveries)}."""
    out = subprocess.run(["sky", "jobs", "queue"], env=env, capture_output=True, text=True, timeout=120)
    found = {}
    for line in out.stdout.splitlines():
        match = STATUS.match(line)
        if match:
            found[match.group(1)] = (match.group(3), int(match.group(2)))
    return found


def slurm_jobs(env: dict[str, str], prefix: str) -> list[str]:
    out = subprocess.run(["squeue", "-h", "-o", "%i %j"], env=env, capture_output=True, text=True, timeout=30)
    return [
        line.split()[0] for line in out.stdout.splitlines() if line.split()[1:2] and line.split()[1].startswith(prefix)
    ]


def wait(condition, timeout: float, message: str, interval: float = 5.0, alive=None):  # noqa: ANN001, ANN201
    """Poll `condition` (bounded in time); fail at once, with the launcher's log, if the launcher died."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = condition()
        if value:
            return value
        if alive is not None:
            alive()
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout:.0f} s waiting for {message}")


@pytest.mark.slow
@pytest.mark.timeout(2400)
def test_skypilot_recovers_a_preempted_learner_on_slurm_and_every_token_is_accounted(tmp_path, shakespeare):
    env = {**os.environ, **local_setup()}
    env.update(
        {
            "DDILOCO_TOKEN": TOKEN,  # `sky` gets it as --secret DDILOCO_TOKEN from its environment
            "DDILOCO_SKY_PYTHON": sys.executable,  # the nodes are this machine: this venv has ddiloco
            "DDILOCO_SKY_SETUP": "true",
            "SKYPILOT_DISABLE_USAGE_COLLECTION": "1",
        }
    )
    name = f"e2e{os.getpid()}"
    run_dir, store, port = tmp_path / name, tmp_path / "store", free_port()
    store.mkdir()
    budget = 2 * 750 * TOKENS_PER_STEP  # about 12 minutes of one learner alone at 0.5 s a step
    launcher_log = tmp_path / "launcher.log"
    command = [
        *("nice", "-n", "10", sys.executable, "-m", "ddiloco", "run", "--backend", "skypilot", "--json"),
        *("--infra", env["DDILOCO_SKY_INFRA"], "--store", str(store), "--run-dir", str(run_dir)),
        *("--sky-port", str(port), "--learners", "2", "--model-size", "tiny", "--seq-len", "16"),
        *("--data", shakespeare, "--batch-size", "4", "--fragments", "2", "--sync-every", "4"),
        *("--heartbeat", "0.2", "--threads", "1", "--min-step-seconds", "0.5", "--tokens", str(budget)),
        *("--term-grace", "5"),
    ]
    with open(launcher_log, "wb") as log:
        launcher = subprocess.Popen(command, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    run: dict = {}

    def alive() -> None:
        assert launcher.poll() is None, launcher_log.read_text()[-3000:]

    def status() -> dict:
        address = store / "sync-0" / "address"
        try:
            return sky.status(address.read_text().strip(), TOKEN, None, timeout=3.0)
        except (OSError, ConnectionError, ValueError):
            return {}

    def contributions(m: int) -> int:
        return int(status().get("books", {}).get(str(m), {}).get("contributions", 0))

    seen: set[str] = set()
    try:
        run = wait(lambda: _recorded(run_dir), 1200, "both learner jobs launched", alive=alive)
        job1 = run["jobs"]["learner1"]
        wait(lambda: all(contributions(m) >= 2 for m in range(2)), 900, "both learners to contribute", alive=alive)
        before = contributions(1)
        prefix = f"{run['cluster'].removesuffix('-sync')}-learner1-{job1}-"
        allocations = slurm_jobs(env, prefix)
        assert len(allocations) == 1, (prefix, allocations)
        subprocess.run(["scancel", allocations[0]], env=env, check=True, timeout=30)  # the preemption

        def recovered() -> bool:
            state = sky_jobs(env).get(job1, ("?", 0))
            seen.add(state[0])
            assert not state[0].startswith("FAILED"), f"learner1's job ended {state[0]}"
            return state[0] == "RUNNING" and state[1] >= 1 and "RECOVERING" in seen

        wait(recovered, 900, "SkyPilot to recover learner1's job (RECOVERING, then RUNNING)", 10.0, alive)
        new = wait(lambda: slurm_jobs(env, prefix), 60, "learner1's new allocation")
        assert new != allocations
        wait(lambda: contributions(1) >= before + 2, 600, "the recovered learner to rejoin and contribute", alive=alive)
        assert launcher.wait(1200) == 0, launcher_log.read_text()[-3000:]  # the budget, then jobs cancelled, down
    finally:
        _clean_up(launcher, run, env, tmp_path)
    out = json.loads(launcher_log.read_text().strip().splitlines()[-1])
    final = json.loads((store / "sync-0" / "summary.json").read_text())
    assert out["summary"]["finished"] and final["finished"]
    assert final["double_merged_steps"] == 0 and final["tokens_reported"] >= budget
    first, second = sorted(journals(store, 1), key=lambda j: j["started"])[:2]
    assert first["incarnation"] != second["incarnation"] and second["start_position"] <= first["position"]
    trained = 0
    for m in range(2):
        for j in journals(store, m):
            assert j["tokens"] == (j["position"] - j["start_position"]) * TOKENS_PER_STEP
            trained += j["tokens"]
        assert final["books"][str(m)]["tokens_merged"] <= sum(j["tokens"] for j in journals(store, m))
    assert 0 < final["tokens_merged"] <= trained and final["tokens_reported"] <= trained
    assert final["tokens_merged"] == final["tokens_reported"]
    states = sky_jobs(env)
    assert all(states.get(job, ("?",))[0] in ("SUCCEEDED", "CANCELLED") for job in run["jobs"].values()), states
    assert states[run["jobs"]["learner1"]][1] >= 1
    assert not slurm_jobs(env, run["cluster"].removesuffix("-sync"))  # nothing left on Slurm
    for path in [*run_dir.rglob("*.yaml"), *store.rglob("*.log")]:
        assert TOKEN not in path.read_text()  # only ever in the environment and the 0600 file
    assert read_journals(store / "learner-0", "journal-*.json")


def _recorded(run_dir: Path) -> dict | None:
    try:
        run = sky.read_run(run_dir)
    except (OSError, ValueError):
        return None
    return run if len(run["jobs"]) == 2 else None


def _clean_up(launcher: subprocess.Popen, run: dict, env: dict[str, str], tmp_path: Path) -> None:
    """The launcher's own stop first (SIGTERM, by its PID); whatever is left, by ID and by name."""
    if launcher.poll() is None:
        os.kill(launcher.pid, signal.SIGTERM)
        try:
            launcher.wait(300)
        except subprocess.TimeoutExpired:
            os.killpg(launcher.pid, signal.SIGKILL)
            launcher.wait(30)
    run = run or next(filter(None, (_recorded(d) for d in tmp_path.glob("e2e*"))), {})
    if not run:
        return
    states = sky_jobs(env)
    left = [job for job in run["jobs"].values() if states.get(job, ("?",))[0] not in ("SUCCEEDED", "CANCELLED")]
    with contextlib.suppress(subprocess.TimeoutExpired):
        if left:
            subprocess.run(["sky", "jobs", "cancel", "-y", *left], env=env, capture_output=True, timeout=300)
        subprocess.run(["sky", "down", "-y", run["cluster"]], env=env, capture_output=True, timeout=600)
        for job in slurm_jobs(env, run["cluster"].removesuffix("-sync")):
            subprocess.run(["scancel", job], env=env, capture_output=True, timeout=30)
