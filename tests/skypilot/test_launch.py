"""What `ddiloco run --backend skypilot` asks of SkyPilot, checked against a stand-in `sky` on PATH
that records its arguments and environment: the synchronizer's cluster first (provisioned, its public
address asked for, then started with it), then one managed job per learner; the token only ever in
sky's environment; the launch recorded for `ddiloco skypilot-stop`, which cancels the jobs and takes
the cluster down. (The real `sky` against a local Slurm cluster: test_sky_e2e.py.)"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from ddiloco.cluster import skypilot as sky

from .tasks import TOKEN

FAKE_SKY = r"""#!/usr/bin/env python3
import json, os, sys
log = os.environ["FAKE_SKY_LOG"]
with open(log, "a") as f:
    f.write(json.dumps({"args": sys.argv[1:], "token": os.environ.get("DDILOCO_TOKEN")}) + "\n")
args = sys.argv[1:]
if args[:2] == ["status", "--ip"]:
    print("127.0.0.1")
elif args[:2] == ["jobs", "launch"]:
    n = sum(1 for line in open(log) if '"jobs", "launch"' in line)
    print(f"Managed job ID: {40 + n}")
elif args[:1] == ["launch"] and os.environ.get("FAKE_SKY_FAIL") == "launch":
    print("no capacity", file=sys.stderr)
    sys.exit(1)
"""


def fake_sky(tmp_path) -> dict[str, str]:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "sky").write_text(FAKE_SKY.replace("#!/usr/bin/env python3", f"#!{sys.executable}"))
    (bin_dir / "sky").chmod(0o755)
    return {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "FAKE_SKY_LOG": str(tmp_path / "sky.log")}


def calls(tmp_path) -> list[dict]:
    return [json.loads(line) for line in (tmp_path / "sky.log").read_text().splitlines()]


def ddiloco(env: dict[str, str], *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "ddiloco", *args], capture_output=True, text=True, timeout=120, env=env
    )


def test_launch_then_skypilot_stop_and_the_token_never_on_a_command_line(tmp_path):
    env = {**fake_sky(tmp_path), "DDILOCO_TOKEN": TOKEN}
    run = tmp_path / "run"
    common = ("run", "--backend", "skypilot", "--detach", "--json", "--model-size", "tiny", "--learners", "2")
    done = ddiloco(env, *common, "--tokens", "50000", "--store", "s3://b/x", "--run-dir", str(run))
    assert done.returncode == 0, done.stderr[-3000:]
    assert json.loads(done.stdout.strip().splitlines()[-1])["jobs"] == {"learner0": "41", "learner1": "42"}
    launched = calls(tmp_path)
    sync_yaml, cluster = str(run / "skypilot" / "sync.yaml"), "ddiloco-run-sync"
    assert [c["args"][:2] for c in launched] == [["launch", "-y"], ["status", "--ip"], ["exec", cluster]] + [
        ["jobs", "launch"]
    ] * 2
    assert launched[0]["args"][-1] == sync_yaml and "--detach-run" in launched[0]["args"]
    assert "DDILOCO_ADVERTISE=127.0.0.1" in launched[2]["args"] and launched[2]["args"][-1] == sync_yaml
    assert (
        launched[3]["args"][-1] == str(run / "skypilot" / "learner0.yaml")
        and "ddiloco-run-learner0" in launched[3]["args"]
    )
    for call in launched:
        assert TOKEN not in " ".join(call["args"]) and "--secret" in call["args"] or call["args"][0] == "status"
        assert call["args"][0] == "status" or call["token"] == TOKEN  # given to sky in its environment only
    recorded = json.loads((run / "skypilot" / "run.json").read_text())
    assert recorded["addresses"] == ["127.0.0.1:7070"] and recorded["jobs"] == {"learner0": "41", "learner1": "42"}
    # skypilot-stop: nobody answers at the address, so it cancels the jobs and takes the cluster down
    stopped = ddiloco(env, "skypilot-stop", str(run))
    assert stopped.returncode == 0, stopped.stderr[-3000:]
    after = [c["args"] for c in calls(tmp_path)[len(launched) :]]
    assert after == [["jobs", "cancel", "-y", "41", "42"], ["down", "-y", cluster]]


def test_a_failed_launch_leaves_nothing_running_and_says_why(tmp_path, monkeypatch):
    for key, value in fake_sky(tmp_path).items():
        monkeypatch.setenv(key, value)
    monkeypatch.setenv("FAKE_SKY_FAIL", "launch")
    run = {"cluster": "ddiloco-x-sync", "host": "auto", "public": False, "port": 7070, "shards": 1}
    with pytest.raises(sky.SkyError, match="no capacity"):
        sky.launch(tmp_path, {"sync": tmp_path / "sync.yaml", "learner0": tmp_path / "l0.yaml"}, run, TOKEN)
    assert [c["args"] for c in calls(tmp_path)] == [
        [
            "launch",
            "-y",
            "-c",
            "ddiloco-x-sync",
            "--detach-run",
            "--secret",
            "DDILOCO_TOKEN",
            str(tmp_path / "sync.yaml"),
        ],
        ["down", "-y", "ddiloco-x-sync"],
    ]
    assert sky.read_run(tmp_path)["jobs"] == {}
    with pytest.raises(FileNotFoundError, match="no SkyPilot launch recorded"):
        sky.read_run(tmp_path / "elsewhere")


def test_on_a_private_infra_the_launcher_follows_the_addresses_published_on_a_local_store(tmp_path, monkeypatch):
    """--sync-host not given on Slurm: the address is the node's, known only once the synchronizer
    task publishes it on the store; the launcher reads it there (again each time), and a shard that
    finished and exited between two polls is seen finished through the summary it left."""
    from ddiloco.backends import skypilot as _skypilot

    store = tmp_path / "store"
    run = {"cluster": "c-sync", "jobs": {}, "shards": 1, "store": str(store), "launched": 0.0}
    assert _skypilot.addresses(run) == [] and _skypilot.addresses({**run, "store": "s3://b/x"}) == []
    (store / "sync-0").mkdir(parents=True)
    (store / "sync-0" / "address").write_text("127.0.0.1:7070\n")
    assert _skypilot.addresses(run) == ["127.0.0.1:7070"]
    assert _skypilot.addresses({**run, "addresses": ["10.0.0.1:7070"]}) == ["10.0.0.1:7070"]
    asked = []

    def status(address: str, token: object, ca: object) -> dict:
        asked.append(address)
        raise ConnectionError("gone")

    monkeypatch.setattr(sky, "status", status)
    assert _skypilot._statuses(run, TOKEN, None) is None  # no answer, no summary yet
    (store / "sync-0" / "summary.json").write_text(json.dumps({"finished": True, "tokens_merged": 5}))
    assert _skypilot._statuses(run, TOKEN, None) == [{"finished": True, "tokens_merged": 5}]
    assert _skypilot._statuses({**run, "launched": 4e9}, TOKEN, None) is None  # an earlier run's summary
    assert asked == ["127.0.0.1:7070"] * 3


def test_the_python_and_setup_on_the_nodes_can_be_given_for_a_prebuilt_environment(tmp_path, monkeypatch):
    from ddiloco.backends.skypilot import sky_options

    monkeypatch.delenv("DDILOCO_SKY_PYTHON", raising=False)
    monkeypatch.delenv("DDILOCO_SKY_SETUP", raising=False)
    assert sky_options(2, None, None, None).python == "python3"
    monkeypatch.setenv("DDILOCO_SKY_PYTHON", "/opt/venv/bin/python")
    monkeypatch.setenv("DDILOCO_SKY_SETUP", "true")
    opts = sky_options(2, "/shared/run", ["slurm/local"], None)
    assert (opts.python, opts.setup, opts.infra) == ("/opt/venv/bin/python", "true", {"": "slurm/local"})
