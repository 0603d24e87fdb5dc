"""Helpers of the SkyPilot backend's tests: write a run's task YAMLs with the real CLI (--dry-run), and
run a task's `run:` script on this machine the way SkyPilot runs it on a node: bash, with the task's
`envs:`, its secrets and SkyPilot's own SKYPILOT_* variables in the environment, and each
file_mounts target read from its local source."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import yaml

TOKEN = "sky-test-token"


def dry_run(run: Path, *extra: str, token: str | None = TOKEN) -> dict:
    env = {k: v for k, v in os.environ.items() if k != "DDILOCO_TOKEN"}
    if token is not None:
        env["DDILOCO_TOKEN"] = token
    out = subprocess.run(
        [sys.executable, "-m", "ddiloco", "run", "--backend", "skypilot", "--dry-run", "--json", "--run-dir", str(run)]
        + list(extra),
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


def load(path: str | Path) -> dict:
    return yaml.safe_load(Path(path).read_text())


def node_env(task: dict, task_id: str, overrides: dict[str, str], secret: str = TOKEN) -> dict[str, str]:
    """What the `run:` script sees on a one-node SkyPilot cluster whose address is 127.0.0.1."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("DDILOCO_", "SKYPILOT_"))}
    mounts = {t: s for t, s in (task.get("file_mounts") or {}).items() if isinstance(s, str)}
    for key, value in (task.get("envs") or {}).items():
        value = "" if value is None else str(value)
        for target, source in mounts.items():  # a mounted path, read here from its local source
            if value == target or value.startswith(target + "/"):
                value = source + value[len(target) :]
        env[key] = value
    env.update(
        {
            "SKYPILOT_TASK_ID": task_id,
            "SKYPILOT_NODE_RANK": "0",
            "SKYPILOT_NUM_NODES": "1",
            "SKYPILOT_NODE_IPS": "127.0.0.1",
            "SKYPILOT_NUM_GPUS_PER_NODE": "0",
            "SKYPILOT_CLUSTER_INFO": json.dumps({"cluster_name": task["name"], "cloud": "Slurm", "region": "local"}),
            "DDILOCO_PYTHON": sys.executable,
            "DDILOCO_TOKEN": secret,  # a SkyPilot secret: in the environment, never on a command line
            **overrides,
        }
    )
    return env


def start(task: dict, env: dict[str, str], log: Path) -> subprocess.Popen:
    """The task's `run:` as SkyPilot starts it: bash on a script file, its own process group."""
    script = log.with_suffix(".sh")
    script.write_text(task["run"])
    out = open(log, "ab")
    return subprocess.Popen(
        ["bash", str(script)], env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
    )
