"""The `ddiloco` command as a user runs it: a mistake (a wrong flag or value, a missing, empty or corrupt
file or run directory) is one line on stderr naming the flag or the file, exit code 2, no traceback."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest


def ddiloco(*args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "DDILOCO_DEBUG"}
    return subprocess.run(
        [sys.executable, "-m", "ddiloco", *args], capture_output=True, text=True, timeout=120, env=env
    )


def run_dir(tmp_path: Path, config: object = None, metrics: bytes | None = b"", events: bytes | None = None) -> Path:
    d = tmp_path / "run"
    d.mkdir()
    (d / "config.json").write_text(json.dumps({"settings": {"method": "decoupled"}} if config is None else config))
    if metrics is not None:
        (d / "metrics.jsonl").write_bytes(metrics)
    if events is not None:
        (d / "events.jsonl").write_bytes(events)
    return d


def one_line(out: subprocess.CompletedProcess[str], *names: str) -> str:
    assert out.returncode == 2, out.stderr
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in out.stderr, out.stderr
    for name in names:
        assert name in lines[0], lines[0]
    return lines[0]


@pytest.mark.parametrize(
    ("layout", "says"),
    [
        ({"config": [1, 2]}, "config.json: not a run's config.json"),
        ({"config": {"settings": [1]}}, "config.json: not a run's config.json"),
        ({"metrics": None}, "metrics.jsonl: missing"),
        ({"metrics": b"\x85\x00\xff binary"}, "metrics.jsonl: not a JSON-lines log"),
        ({"events": b"\x85\x00\xff binary"}, "events.jsonl: not a JSON-lines log"),
    ],
)
def test_a_broken_run_directory_is_one_line_naming_the_file(tmp_path, layout, says):
    d = run_dir(tmp_path, **layout)
    assert says in one_line(ddiloco("report", str(d)), str(d))


def test_a_folder_that_holds_no_run_and_a_missing_folder_are_one_line(tmp_path):
    one_line(ddiloco("report", str(tmp_path)), "ddiloco report: error:", "not a run directory")
    one_line(ddiloco("report", str(tmp_path / "nope")), "no such directory")


@pytest.mark.parametrize(
    ("args", "names"),
    [
        (["run", "--bogus"], ["No such option: --bogus", "ddiloco run --help"]),
        (["run", "--tokens", "0"], ["--tokens"]),
        (["sim", "--data", "/nonexistent/corpus.txt", "--tokens", "100"], ["/nonexistent/corpus.txt"]),
        (["synchronizer", "--port", "70000"], ["--port"]),
        (["report"], ["RUN_DIR"]),
        (["run", "--allreduce-precision", "fp16"], ["--allreduce-precision"]),
        (
            ["run", "--method", "decoupled", "--allreduce-precision", "fp32", "--tokens", "100"],
            ["--allreduce-precision"],
        ),
    ],
)
def test_a_wrong_flag_or_value_is_one_line_naming_it(args, names):
    one_line(ddiloco(*args), *names)


def test_the_command_alone_prints_its_help():
    out = ddiloco()
    assert out.returncode == 0 and "Usage" in out.stdout + out.stderr
