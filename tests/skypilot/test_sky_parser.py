"""The YAMLs `--dry-run` writes load with SkyPilot's own parser (`sky.Task.from_yaml`), and SkyPilot
reads from them what we meant: on-demand synchronizer with its ports, spot learners with job recovery
on their own infra and accelerators, the bucket mounted, the token a secret given at launch.

SkyPilot is an optional extra (`pip install 'ddiloco[skypilot]'`); it pins click below 8.2, which
the dev tools' huggingface-hub does not accept, so CI may keep it in a venv of its own and name that
venv's python in $DDILOCO_SKYPILOT_PYTHON. Without either, the test skips and says so."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys

import pytest

from .tasks import dry_run

READ = r"""
import json, sys
import sky
out = {}
for path in sys.argv[1:]:
    task = sky.Task.from_yaml(path)
    with open(path) as f:
        import yaml
        given = sky.Task.from_yaml_config(yaml.safe_load(f), secrets_overrides=[("DDILOCO_TOKEN", "x")])
    (r,) = task.resources
    out[path] = {
        "name": task.name,
        "cloud": str(r.cloud),
        "region": r.region,
        "use_spot": r.use_spot,
        "accelerators": r.accelerators,
        "ports": r.ports,
        "job_recovery": r.job_recovery,
        "envs": task.envs,
        "secret_given": sorted(given.secrets),
        "storage": {k: v.source for k, v in task.storage_mounts.items()},
        "file_mounts": task.file_mounts,
        "run": task.run,
    }
print(json.dumps(out, default=str))
"""


def skypilot_python() -> str | None:
    if importlib.util.find_spec("sky") is not None:
        return sys.executable
    return os.environ.get("DDILOCO_SKYPILOT_PYTHON") or None


@pytest.mark.timeout(180)
def test_the_task_yamls_load_with_skypilots_own_parser(tmp_path):
    python = skypilot_python()
    if python is None:
        pytest.skip("SkyPilot is not installed: pip install 'ddiloco[skypilot]' (or set $DDILOCO_SKYPILOT_PYTHON)")
    result = dry_run(
        tmp_path / "run",
        *("--model-size", "tiny", "--learners", "2", "--tokens", "50000", "--store", "s3://ddiloco-test/exp1"),
        *("--infra", "sync=aws/us-east-1", "--infra", "learner0=gcp/us-central1", "--infra", "learner1=aws/eu-west-1"),
        *("--accelerators", "learner0=L4:1", "--accelerators", "learner1=A100:8"),
    )
    paths = [result["tasks"][r] for r in ("sync", "learner0", "learner1")]
    done = subprocess.run(
        [python, "-c", READ, *paths], capture_output=True, text=True, timeout=150, cwd=tmp_path, env=os.environ
    )
    assert done.returncode == 0, done.stderr[-3000:]
    sync, learner0, learner1 = (json.loads(done.stdout.strip().splitlines()[-1])[p] for p in paths)
    assert sync["cloud"] == "AWS" and sync["region"] == "us-east-1" and sync["use_spot"] is False
    assert sorted(sync["ports"]) == ["7070", "7170"]
    assert sync["storage"] == {"/ddiloco": "s3://ddiloco-test/exp1"} and "/ddiloco-tls" in sync["file_mounts"]
    for learner, (cloud, region, acc) in (
        (learner0, ("GCP", "us-central1", {"L4": 1})),
        (learner1, ("AWS", "eu-west-1", {"A100": 8})),
    ):
        assert (learner["cloud"], learner["region"], learner["accelerators"]) == (cloud, region, acc)
        assert learner["use_spot"] is True and learner["job_recovery"]["strategy"] == "EAGER_NEXT_REGION"
        assert learner["storage"] == {"/ddiloco": "s3://ddiloco-test/exp1"}
        assert 'exec "$DDILOCO_PYTHON" -m ddiloco learner' in learner["run"]
    for task in (sync, learner0, learner1):
        assert task["secret_given"] == ["DDILOCO_TOKEN"] and "DDILOCO_TOKEN" not in task["envs"]
