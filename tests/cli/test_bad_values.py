"""Nonsense flags and broken files end in a clear error: exit code 2, the flag or file named, no
traceback (issue 9, defects 9 and 10)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys

import pytest
import torch
from safetensors.torch import save_file
from typer.testing import CliRunner

from ddiloco.cli import _register, app

_register()
runner = CliRunner()


def invoke(*args: str):
    return runner.invoke(app, list(args), catch_exceptions=False, env={"COLUMNS": "300"})


@pytest.mark.parametrize(
    "args, flag",
    [
        (["synchronizer", "--port", "70000"], "--port"),
        (["synchronizer", "--port", "-1"], "--port"),
        (["synchronizer", "--chunk-bytes", "0"], "--chunk-bytes"),
        (["synchronizer", "--max-message-bytes", "0"], "--max-message-bytes"),
        (["synchronizer", "--tokens", "-5"], "--tokens"),
        (["synchronizer", "--duration", "-1"], "--duration"),
        (["synchronizer", "--heartbeat", "0"], "--heartbeat"),
        (["synchronizer", "--max-learners", "0"], "--max-learners"),
        (["synchronizer", "--codec-down", "int3"], "--codec-down"),
        (["synchronizer", "--learners", "0"], "--learners"),
        (["learner", "--id", "0", "--codec", "int3"], "--codec"),
        (["learner", "--id", "0", "--precision", "fp8"], "--precision"),
        (["learner", "--id", "-1"], "--id"),
        (["learner", "--id", "0", "--batch-size", "0"], "--batch-size"),
        (["run", "--codec", "int3"], "--codec"),
        (["run", "--heartbeat", "0"], "--heartbeat"),
        (["run", "--tokens", "0"], "--tokens"),
        (["run", "--duration", "-3"], "--duration"),
        (["run", "--sync-shards", "0"], "--sync-shards"),
        # the data-parallel baselines refuse the flags of another backend as the DiLoCo runs do
        (["run", "--method", "ddp", "--partition", "gpu"], "--partition: only with --backend slurm"),
        (["run", "--method", "elastic-ddp", "--max-restarts", "5"], "--max-restarts: only with --backend slurm"),
        (["run", "--method", "ddp", "--infra", "aws"], "only with skypilot"),
        (["run", "--method", "ddp", "--backend", "slurm", "--store", "s3://b"], "only with skypilot"),
        # metric sinks need a run that this command follows and records
        (["run", "--backend", "slurm", "--detach", "--tensorboard", "tb"], "--tensorboard, --wandb: only for a run"),
        (["run", "--backend", "skypilot", "--wandb"], "--tensorboard, --wandb: only for a run"),
        (["goodput", "--overlap", "30"], "--overlap"),
        (["goodput", "--mtbi-years", "-1"], "--mtbi-years"),
        (["goodput", "--chips", "0"], "--chips"),
        (["sim", "--seq-len", "0"], "--seq-len"),
        (["sim", "--sync-every", "0"], "--sync-every"),
        (["sim", "--grace", "2"], "grace"),
        (["sim", "--outer-momentum", "1.5"], "--outer-momentum"),
        (["sim", "--learners", "0"], "--learners"),
        (["sim", "--model", "foo"], "foo"),
        (["demo", "--tokens", "5"], "--tokens"),
        (["demo", "--learners", "1"], "--learners"),
        (["report", "/nonexistent-run"], "/nonexistent-run: no such directory"),
    ],
)
def test_bad_flag_values_are_refused_up_front(args, flag):
    result = invoke(*args)
    assert result.exit_code == 2, result.output
    assert flag in result.output and "Traceback" not in result.output
    assert not re.search(r"\b[a-z]+_[a-z_]+ must", result.output), "the error names a Python variable"


@pytest.fixture()
def init_file(tmp_path):
    path = tmp_path / "init.safetensors"
    save_file({"w": torch.zeros(8, 4), "b": torch.zeros(4)}, str(path))
    return path


class Finished:
    def __init__(self, proc: subprocess.CompletedProcess) -> None:
        self.exit_code, self.output = proc.returncode, proc.stdout + proc.stderr


def start_synchronizer(init, *extra: str) -> Finished:
    """A real `ddiloco synchronizer` process (it sets up process-wide logging and signal handlers)."""
    args = [
        sys.executable,
        "-m",
        "ddiloco",
        "synchronizer",
        "--init",
        str(init),
        "--fragments",
        "2",
        "--sync-every",
        "4",
        "--port",
        "0",
        "--log-level",
        "error",
        "--exit-when-done",
        *extra,
    ]
    env = {**os.environ, "COLUMNS": "500"}  # error panels wrap at the terminal width
    return Finished(subprocess.run(args, capture_output=True, text=True, timeout=120, env=env))


@pytest.mark.parametrize(
    "content, message",
    [
        (b"", "not a readable safetensors"),
        (b"garbage" * 10, "not a readable safetensors"),
        (None, "NaN or Inf"),
    ],
)
def test_broken_init_files_are_named(tmp_path, init_file, content, message):
    if content is None:
        save_file({"w": torch.full((8, 4), float("nan")), "b": torch.zeros(4)}, str(init_file))
    else:
        init_file.write_bytes(content)
    result = start_synchronizer(init_file)
    assert result.exit_code == 2 and message in result.output and "Traceback" not in result.output


def test_truncated_init_file_is_named(tmp_path, init_file):
    init_file.write_bytes(init_file.read_bytes()[:-10])
    result = start_synchronizer(init_file)
    assert result.exit_code == 2 and "init.safetensors" in result.output and "Traceback" not in result.output


@pytest.mark.parametrize(
    "manifest, message",
    [
        ([1, 2], "must be a JSON object"),
        ({"format": 1}, "'fragments'"),
        ({"format": 1, "fragments": {"0": {"version": 0, "file": "../../etc/passwd"}}}, "bad entry"),
        (
            {
                "format": 1,
                "fragments": {
                    "0": {"version": 0, "file": "p0000-v00000000.safetensors"},
                    "1": {"version": 0, "file": "p0001-v00000000.safetensors"},
                },
                "ledger": {"books": {"0": {"tokens_reported": {"x": -1}}}},
            },
            "missing",
        ),
        ("{not json", "not a readable JSON"),
    ],
)
def test_broken_checkpoints_are_named(tmp_path, init_file, manifest, message):
    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    (ckpt / "manifest.json").write_text(manifest if isinstance(manifest, str) else json.dumps(manifest))
    result = start_synchronizer(init_file, "--checkpoint-dir", str(ckpt))
    assert result.exit_code == 2, result.output
    assert message in result.output and "Traceback" not in result.output


@pytest.mark.parametrize(
    "args, message",
    [
        (["learner", "--id", "0", "--connect", "nonsense"], "bad synchronizer address 'nonsense'"),
        (["learner", "--id", "0", "--connect", "127.0.0.1:99999"], "port in 1..65535"),
        (["run", "--run-dir", "/proc/ddiloco-test", "--tokens", "100"], "--run-dir"),
    ],
)
def test_bad_addresses_and_folders_are_named_without_retrying(args, message):
    env = {**os.environ, "COLUMNS": "500"}
    proc = subprocess.run(
        [sys.executable, "-m", "ddiloco", *args, "--model-size", "tiny"],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
    )
    assert proc.returncode == 2 and message in proc.stderr and "Traceback" not in proc.stderr, proc.stderr[-2000:]


def test_version():
    from ddiloco import __version__

    result = invoke("--version")
    assert result.exit_code == 0 and result.output.strip() == f"ddiloco {__version__}"


def test_choices_match_what_the_code_accepts():
    from ddiloco.cli import options
    from ddiloco.sim.config import METHODS
    from ddiloco.train.device import PRECISIONS
    from ddiloco.train.tasks import MODEL_SIZES, MODELS

    assert {m.value for m in options.Model} == set(MODELS)
    assert {m.value for m in options.ModelSize} == set(MODEL_SIZES)
    assert {m.value for m in options.Precision} == set(PRECISIONS)
    assert {m.value for m in options.SimMethod} == set(METHODS)
    assert {m.value for m in options.RuntimeMethod} <= set(METHODS)
    result = invoke("sim", "--model", "gtp")
    assert result.exit_code == 2 and "gpt-moe" in result.output  # the choices are listed


def test_slurm_stop_on_a_data_parallel_run_says_how_to_stop_it(tmp_path):
    """A data-parallel run on Slurm is followed by its launcher (no run.json, no shards to stop): the
    error says where to stop it, and which jobs to cancel if the launcher is gone."""
    (tmp_path / "slurm").mkdir()
    (tmp_path / "slurm" / "jobs.json").write_text(json.dumps({"worker0": "101", "worker1": "102"}))
    (tmp_path / "dataparallel.jsonl").write_text("")
    out = invoke("slurm-stop", str(tmp_path))
    text = " ".join(out.output.split())
    assert out.exit_code == 2, out.output
    assert "data-parallel run" in text and "scancel 101 102" in text and "Traceback" not in text
    (tmp_path / "dataparallel.jsonl").unlink()  # neither kind of run: the missing file is named
    out = invoke("slurm-stop", str(tmp_path))
    assert out.exit_code == 2 and "run.json" in " ".join(out.output.split())
