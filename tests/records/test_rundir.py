"""What a run directory writes: settings as JSON, never the auth token."""

from __future__ import annotations

import dataclasses
import enum
import json
from pathlib import Path

from ddiloco.launch.config import RunConfig
from ddiloco.records.rundir import RunDir, jsonable, redact_argv


class Colour(enum.Enum):
    red = "red"


@dataclasses.dataclass
class Inner:
    path: Path
    pair: tuple
    colour: Colour


def test_jsonable_turns_settings_into_plain_json():
    value = {"inner": Inner(Path("/a/b"), (1, 2.5), Colour.red), 3: {"x": None}}
    assert jsonable(value) == {"inner": {"path": "/a/b", "pair": [1, 2.5], "colour": "red"}, "3": {"x": None}}


def test_config_json_never_holds_the_token(tmp_path):
    config = RunConfig(run_dir=tmp_path, token="s3cret-value", tokens=1000)
    RunDir(tmp_path).write_config("run", config, clock_origin=0.0)
    text = (tmp_path / "config.json").read_text()
    assert "s3cret-value" not in text
    settings = json.loads(text)["settings"]
    assert settings["token"] == "<redacted>" and settings["tokens"] == 1000
    assert jsonable({"token": None})["token"] is None  # no token: nothing to hide, and it says so


def test_config_json_never_holds_a_secret_given_on_the_command_line(tmp_path, monkeypatch):
    argv = ["ddiloco", "run", "--token", "s3cret-a", "--tokens", "1000", "--token=s3cret-b", "--wandb-token", "c"]
    monkeypatch.setattr("sys.argv", argv)
    RunDir(tmp_path).write_config("run", RunConfig(run_dir=tmp_path, tokens=1000), clock_origin=0.0)
    text = (tmp_path / "config.json").read_text()
    assert "s3cret" not in text and '"c"' not in text
    assert json.loads(text)["argv"] == [
        "ddiloco",
        "run",
        "--token",
        "<redacted>",
        "--tokens",
        "1000",
        "--token=<redacted>",
        "--wandb-token",
        "<redacted>",
    ]
    assert redact_argv(["--tokens=5", "--tokens", "7"]) == ["--tokens=5", "--tokens", "7"]  # a budget, not a secret
