"""The task YAMLs `ddiloco run --backend skypilot --dry-run` writes (no SkyPilot needed): one on-demand
task for every shard, one spot managed job per learner with its own infra and accelerators, the token
a required secret and never in a file SkyPilot sees, TLS and opened ports beyond a private network."""

from __future__ import annotations

import subprocess

import pytest
from typer.testing import CliRunner

from ddiloco.cli import _register, app
from ddiloco.cluster.skypilot_tasks import SkyOptions, parse_roles
from ddiloco.cluster.skypilot_yaml import dump

from .tasks import TOKEN, dry_run, load

BASE = ("--model-size", "tiny", "--learners", "2", "--sync-shards", "2", "--tokens", "50000")


def test_a_public_run_has_one_sync_task_spot_learners_on_their_own_infra_tls_and_no_token(tmp_path):
    result = dry_run(
        tmp_path / "run",
        *BASE,
        *("--store", "s3://bucket/exp1", "--infra", "aws/us-east-1", "--infra", "learner1=gcp/us-central1"),
        *("--accelerators", "learner=L4:1", "--accelerators", "learner1=A100:8", "--sky-port", "9000"),
    )
    assert set(result["tasks"]) == {"sync", "learner0", "learner1"} and "jobs" not in result
    tasks = {role: load(path) for role, path in result["tasks"].items()}
    sync = tasks["sync"]
    assert sync["resources"] == {"use_spot": False, "infra": "aws/us-east-1", "ports": ["9000-9001", "9100-9101"]}
    assert sync["file_mounts"]["/ddiloco"] == {"source": "s3://bucket/exp1", "mode": "MOUNT"}
    assert sync["envs"]["DDILOCO_PUBLIC"] == "1" and sync["envs"]["DDILOCO_TLS"] == "/ddiloco-tls"
    run = sync["run"]
    assert run.count('exec "$DDILOCO_PYTHON" -m ddiloco synchronizer --host 0.0.0.0') == 2
    assert "--port 9001 " in run and "--bulk-port 9101" in run and '"${TLS[@]}"' in run
    assert '--checkpoint-dir "$DDILOCO_RUN"/sync-1' in run  # on the store: a new node restores from it
    for m, (infra, acc) in enumerate((("aws/us-east-1", "L4:1"), ("gcp/us-central1", "A100:8"))):
        learner = tasks[f"learner{m}"]
        assert learner["resources"]["use_spot"] is True and learner["resources"]["infra"] == infra
        assert learner["resources"]["accelerators"] == acc
        assert learner["resources"]["job_recovery"]["max_restarts_on_errors"] == 2
        assert "/ddiloco-tls" not in learner["file_mounts"]  # the CA's key stays with the synchronizer
        assert learner["envs"]["DDILOCO_TLS_CA"] == "/ddiloco-tls-ca/ca.pem"
        connect = '--connect @"$DDILOCO_RUN"/sync-0/address,@"$DDILOCO_RUN"/sync-1/address'
        assert f"{connect} --id {m} " in learner["run"] and '--tls-ca "$DDILOCO_TLS_CA"' in learner["run"]
    out = tmp_path / "run" / "skypilot"
    assert (out / "tls" / "ca.key").stat().st_mode & 0o777 == 0o600 and (out / "tls-ca" / "ca.pem").is_file()
    assert not (out / "tls-ca" / "ca.key").exists()
    assert (tmp_path / "run" / "token").stat().st_mode & 0o777 == 0o600
    for task in tasks.values():
        assert task["secrets"] == {"DDILOCO_TOKEN": None}  # required: sky launch --secret DDILOCO_TOKEN
        assert subprocess.run(["bash", "-n"], input=task["run"], text=True).returncode == 0
    for path in out.rglob("*"):
        assert not path.is_file() or TOKEN.encode() not in path.read_bytes()


def test_a_run_on_one_private_slurm_cluster_opens_no_port_and_needs_no_tls(tmp_path):
    tasks = dry_run(tmp_path / "run", *BASE, "--infra", "slurm/mycluster", "--store", "/shared/runs", token=None)
    sync = load(tasks["tasks"]["sync"])
    assert "ports" not in sync["resources"] and sync["envs"]["DDILOCO_TLS"] == "" and "file_mounts" not in sync
    assert sync["envs"]["DDILOCO_RUN"] == "/shared/runs" and sync["envs"]["DDILOCO_PUBLIC"] == "0"
    learner = load(tasks["tasks"]["learner0"])
    assert "--tls-ca" not in learner["run"] and learner["resources"]["use_spot"] is False  # Slurm has no spot
    assert len((tmp_path / "run" / "token").read_text()) == 32  # made, since the shards listen beyond loopback


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("--backend", "skypilot", "--partition", "gpu"), "--partition: only with --backend slurm"),
        (("--backend", "local", "--infra", "aws"), "only with skypilot"),
        (("--backend", "skypilot", "--infra", "learner7=aws"), "learners are learner0..learner1"),
        (("--backend", "skypilot", "--infra", "head=aws"), "ROLE sync, learner or learnerM"),
        (("--backend", "skypilot", "--learner-mtbf", "5"), "local chaos only"),
        (("--backend", "skypilot", "--detach"), "needs --store"),
    ],
)
def test_bad_flags_are_refused_with_their_reason(tmp_path, monkeypatch, args, message):
    from ddiloco.records import logsetup

    monkeypatch.setattr(logsetup, "configure", lambda *a, **k: None)  # it wants a real stderr; the runner has none
    _register()
    done = CliRunner().invoke(app, ["run", *args, *BASE, "--run-dir", str(tmp_path / "run")], env={"COLUMNS": "300"})
    assert done.exit_code == 2 and message in " ".join(done.output.split()), done.output[-2000:]
    assert not (tmp_path / "run" / "skypilot").exists()


def test_roles_and_the_yaml_writer():
    assert parse_roles(["aws/us-east-1", "learner1=gcp", "sync=k8s"], "--infra", 2) == {
        "": "aws/us-east-1",
        "learner1": "gcp",
        "sync": "k8s",
    }
    opts = SkyOptions(infra={"": "kubernetes", "learner1": "kubernetes/ctx"})
    assert opts.role_value(opts.infra, "learner1") == "kubernetes/ctx" and not opts.public(2)
    assert SkyOptions(infra={"sync": "kubernetes", "learner": "aws"}).public(2)
    import yaml

    doc = {"a": "yes", "b": "012", "c": None, "d": ["x: y", 3], "e": "line\n  two\n", "f": {}, "g-h": True}
    assert yaml.safe_load(dump(doc, "head")) == doc  # strings stay strings, scripts keep their indentation
