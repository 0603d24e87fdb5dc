"""One CLI language: old spellings still work as hidden aliases; --config FILE.toml, flags override it."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from ddiloco.cli import _register, app
from ddiloco.cli.config_file import apply_aliases, split_config

_register()


def test_old_spellings_are_rewritten_to_the_one_name():
    assert apply_aliases(["goodput", "--inner-steps", "24", "--tau=2"]) == [
        "goodput",
        "--sync-every",
        "24",
        "--overlap=2",
    ]
    assert apply_aliases(["sim", "--fail-mtbf", "9", "--events", "e.jsonl"]) == [
        "sim",
        "--learner-mtbf",
        "9",
        "--event-log",
        "e.jsonl",
    ]
    assert apply_aliases(["run", "--learner-mtbf", "9"]) == ["run", "--learner-mtbf", "9"]
    assert apply_aliases(["sim", "--", "--events"]) == ["sim", "--", "--events"]


def test_config_keys_map_to_parameters_with_aliases(tmp_path):
    path = tmp_path / "run.toml"
    path.write_text('sync_every = 12\nfail-mtbf = 30.0\nmodel-size = "tiny"\n')
    args, defaults = split_config(["sim", "--config", str(path), "--learners", "3"], app)
    assert args == ["sim", "--learners", "3"]
    assert defaults == {"sim": {"sync_every": 12, "fail_mtbf": 30.0, "model_size": "tiny"}}


@pytest.mark.parametrize("text, message", [("bogus = 1", "unknown setting 'bogus'"), ("x = [", "not valid TOML")])
def test_bad_config_files_are_named(tmp_path, text, message):
    path = tmp_path / "bad.toml"
    path.write_text(text)
    with pytest.raises(ValueError, match=message):
        split_config(["sim", f"--config={path}"], app)


def test_flags_override_the_config_file_end_to_end(tmp_path, shakespeare):
    path = tmp_path / "sim.toml"
    path.write_text(
        f'model-size = "tiny"\nseq-len = 16\nbatch-size = 4\ntokens = 2000\nlearners = 2\n'
        f'fragments = 2\nsync-every = 4\ndata = "{shakespeare}"\n'
    )
    out = subprocess.run(
        [sys.executable, "-m", "ddiloco", "sim", "--config", str(path), "--learners", "3", "--json", "--quiet"],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "COLUMNS": "300"},
    )
    assert out.returncode == 0, out.stderr[-2000:]
    result = json.loads(out.stdout.strip().splitlines()[-1])
    assert result["learners"] == 3 and result["fragments"] == 2 and result["sync_every"] == 4
    bad = subprocess.run(
        [sys.executable, "-m", "ddiloco", "sim", "--config", str(tmp_path / "none.toml")],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert bad.returncode == 2 and "none.toml" in bad.stderr and "Traceback" not in bad.stderr


def test_a_flag_whose_unit_changed_is_refused_naming_the_new_one():
    # `ddiloco sim --bandwidth` was bytes per second; --net-bandwidth is MB/s, as ddiloco run's
    with pytest.raises(ValueError, match=r"--bandwidth is now --net-bandwidth, in MB/s"):
        apply_aliases(["sim", "--bandwidth=1e9"])
    with pytest.raises(ValueError, match=r"--latency is now --net-latency, in milliseconds"):
        apply_aliases(["sim", "--learners", "2", "--latency", "0.01"])
    assert apply_aliases(["sim", "--", "--latency"]) == ["sim", "--", "--latency"]


def test_a_written_settings_file_reads_back_as_the_same_values(tmp_path):
    """A run's children get their settings as a file (`launch.config.write_toml`): every kind of value
    reads back as it was written, through the parser the child uses."""
    from ddiloco.launch.config import write_toml

    settings = {"learners": 3, "grace": 1e-05, "max_outer_norm_ratio": float("inf"), "final_momentum": True}
    settings |= {"merge": "mean", "data": 'a "quoted" path\\with\ttab', "tokens": None}
    path = tmp_path / "synchronizer.toml"
    write_toml(path, settings)
    args, defaults = split_config(["synchronizer", "--config", str(path), "--port", "0"], app)
    assert args == ["synchronizer", "--port", "0"]
    assert defaults == {"synchronizer": {k: v for k, v in settings.items() if v is not None}}
