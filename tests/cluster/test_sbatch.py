"""The job scripts `ddiloco run --backend slurm --dry-run` writes: valid bash, the same commands as the
local backend, learners requeueable, the token never on a command line (no Slurm needed)."""

from __future__ import annotations

import json
import os
import shlex
import shutil
import subprocess
import sys

import pytest

from ddiloco.cluster.sbatch import SlurmOptions


def dry_run(tmp_path, *extra: str) -> dict:
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "ddiloco",
            "run",
            "--backend",
            "slurm",
            "--dry-run",
            "--json",
            "--model-size",
            "tiny",
            "--learners",
            "2",
            "--sync-shards",
            "2",
            "--tokens",
            "50000",
            "--run-dir",
            str(tmp_path / "run"),
            *extra,
        ],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "DDILOCO_TOKEN": "s3cret-tok"},
    )
    assert out.returncode == 0, out.stderr[-2000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_dry_run_writes_one_script_per_shard_and_learner_and_submits_nothing(tmp_path):
    result = dry_run(
        tmp_path,
        "--procs-per-node",
        "2",
        "--nodes-per-learner",
        "2",
        "--gpus-per-node",
        "4",
        "--partition",
        "gpu",
        "--sbatch-arg=--qos=preempt",
    )
    scripts = {role: open(path).read() for role, path in result["scripts"].items()}
    assert set(scripts) == {"sync0", "sync1", "learner0", "learner1"} and "jobs" not in result
    assert not (tmp_path / "run" / "slurm" / "jobs.json").exists()
    for role, text in scripts.items():
        assert subprocess.run(["bash", "-n"], input=text, text=True).returncode == 0, role
        assert "s3cret-tok" not in text and "--token " not in text  # the token travels in a 0600 file
        assert "#SBATCH --partition=gpu" in text and "#SBATCH --qos=preempt" in text
    token = tmp_path / "run" / "token"
    assert token.read_text() == "s3cret-tok" and (token.stat().st_mode & 0o777) == 0o600
    for m in range(2):
        text = scripts[f"learner{m}"]
        assert "#SBATCH --requeue" in text and "#SBATCH --nodes=2" in text and "#SBATCH --gpus-per-node=4" in text
        assert "torch.distributed.run --nnodes 2 --nproc-per-node 2 --max-restarts 2" in text
        files = ",".join(f"@{tmp_path}/run/sync-{s}/address" for s in range(2))
        settings = tmp_path / "run" / f"learner-{m}" / "learner.toml"  # its settings (`--config`)
        assert f"learner --config {settings} --connect {files} " in text and "--term-grace 20" in text
        assert f"id = {m}\n" in settings.read_text()
    for s in range(2):
        text = scripts[f"sync{s}"]
        settings = tmp_path / "run" / f"sync-{s}" / "synchronizer.toml"
        assert "#SBATCH --requeue" in text and f"synchronizer --config {settings} " in text
        assert f"shard = {s}\nnum_shards = 2\n" in settings.read_text()
        assert '--port "$PORT"' in text and "seq 0 2" in text  # restarted in its job, on the port it had


def test_one_rank_learners_run_without_torchrun_and_chaos_flags_are_refused(tmp_path):
    result = dry_run(tmp_path)
    text = open(result["scripts"]["learner0"]).read()
    assert "torch.distributed.run" not in text and "exec srun --ntasks=1" in text
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "ddiloco",
            "run",
            "--backend",
            "slurm",
            "--dry-run",
            "--tokens",
            "1000",
            "--learner-mtbf",
            "30",
            "--run-dir",
            str(tmp_path / "r2"),
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 2 and "--learner-mtbf" in out.stderr and "local chaos only" in out.stderr


def test_bad_options_are_errors():
    with pytest.raises(ValueError, match="sbatch option"):
        SlurmOptions(extra=("qos=preempt",))
    with pytest.raises(ValueError):
        SlurmOptions(procs_per_node=0)


def test_scratch_learner_state_is_new_at_every_job_start_and_peer_recovery_can_be_turned_off(tmp_path):
    result = dry_run(tmp_path, "--learner-state", "scratch", "--no-peer-recovery", "--max-restarts", "0")
    assert "for attempt in $(seq 0 0)" in open(result["scripts"]["sync0"]).read()  # no restart inside the job
    text = open(result["scripts"]["learner1"]).read()
    assert 'SCRATCH="${TMPDIR:-/tmp}/ddiloco-run-learner1-$SLURM_JOB_ID-${SLURM_RESTART_COUNT:-0}"' in text
    assert '--inner-state-dir "$SCRATCH"' in text and "--config" in text
    assert "peer_recovery = false" in (tmp_path / "run" / "learner-1" / "learner.toml").read_text()
    assert "--inner-state-dir" not in open(dry_run(tmp_path / "b")["scripts"]["learner1"]).read()


def test_slurm_options_without_the_slurm_backend_are_errors(tmp_path):
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "ddiloco",
            "run",
            "--tokens",
            "1000",
            "--partition",
            "gpu",
            "--learner-state",
            "scratch",
            "--run-dir",
            str(tmp_path / "r"),
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 2 and "--partition, --learner-state: only with --backend slurm" in out.stderr


def test_each_node_of_a_multi_node_learner_finds_its_address_rendezvous_role_and_gloo_interface(tmp_path):
    """Not from its host name (which may resolve to 127.0.1.1, or to no address of the cluster's
    network): from Slurm's NodeAddr, run here with a stand-in scontrol and the real `ip`."""
    text = open(dry_run(tmp_path, "--nodes-per-learner", "2")["scripts"]["learner0"]).read()
    assert "export FIRST RDZV PORT" in text
    srun = shlex.split(text[text.index("exec srun ") :])
    assert srun[:5] == ["exec", "srun", "--ntasks-per-node=1", "bash", "-c"] and len(srun) == 6
    *setup, torchrun = srun[5].splitlines()
    assert torchrun.startswith("exec ") and '--rdzv-endpoint "$RDZV:$PORT"' in torchrun
    assert '--rdzv-conf is_host=$IS_HOST --local-addr "$ADDR" -m ddiloco learner' in torchrun
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    scontrol = bin_dir / "scontrol"  # `scontrol show node NAME -o`, as Slurm prints it
    scontrol.write_text('#!/bin/sh\necho "NodeName=$3 Arch=x86_64 NodeAddr=127.0.0.1 NodeHostName=somewhere"\n')
    scontrol.chmod(0o755)
    probe = "\n".join([*setup, 'echo "$ADDR $IS_HOST ${GLOO_SOCKET_IFNAME:-unset}"'])

    def node(name: str, **env: str) -> list[str]:
        base = {k: v for k, v in os.environ.items() if k != "GLOO_SOCKET_IFNAME"}
        env = {**base, "PATH": f"{bin_dir}:{os.environ['PATH']}", "SLURMD_NODENAME": name, "FIRST": "n1", **env}
        out = subprocess.run(["bash", "-c", probe], env=env, capture_output=True, text=True, timeout=30)
        assert out.returncode == 0, out.stderr
        assert f"learner node {name} at 127.0.0.1" in out.stderr  # said in the job's log
        return out.stdout.split()

    loopback = "lo" if shutil.which("ip") else "unset"  # the interface that holds 127.0.0.1
    assert node("n1") == ["127.0.0.1", "1", loopback]  # the first node hosts the rendezvous store
    assert node("n2") == ["127.0.0.1", "0", loopback]
    assert node("n2", GLOO_SOCKET_IFNAME="ib0") == ["127.0.0.1", "0", "ib0"]  # the user's choice stays
