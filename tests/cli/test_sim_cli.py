"""`ddiloco sim` as a user runs it: a real process, a JSON last line, clear errors."""

import json
import os
import subprocess
import sys

import pytest

REQUIRED = {
    "method",
    "learners",
    "tokens",
    "eval_loss",
    "goodput",
    "uptime",
    "sim_seconds",
    "wall_seconds",
    "outer_steps",
    "contributions",
}


def ddiloco(*args, timeout=120):
    env = {**os.environ, "COLUMNS": "300"}  # error panels wrap at the terminal width
    return subprocess.run(
        [sys.executable, "-m", "ddiloco", *args], capture_output=True, text=True, timeout=timeout, env=env
    )


@pytest.mark.parametrize("method", ["decoupled", "elastic-ddp", "diloco"])
def test_json_summary_is_the_last_line(shakespeare, method, tmp_path):
    trace = tmp_path / "trace.csv"
    trace.write_text("learner,down_at,up_at\n1,3.5,9.5\n")
    out = ddiloco(
        "sim",
        "--method",
        method,
        "--model-size",
        "tiny",
        "--seq-len",
        "16",
        "--batch-size",
        "4",
        "--tokens",
        "4000",
        "--learners",
        "3",
        "--sync-every",
        "4",
        "--data",
        shakespeare,
        "--failures",
        str(trace),
        "--json",
        "--quiet",
        *([] if method == "diloco" else ["--fragments", "2"]),
    )  # diloco ignores P (default 24 > H)
    assert out.returncode == 0, out.stderr
    result = json.loads(out.stdout.strip().splitlines()[-1])
    assert set(result) >= REQUIRED
    assert result["method"] == method and result["learners"] == 3 and result["tokens"] >= 4000
    assert 0 < result["goodput"] <= 1 and 0 < result["uptime"] <= 1


def test_event_log_records_failures_and_merges(shakespeare, tmp_path):
    trace = tmp_path / "trace.csv"
    trace.write_text("learner,down_at,up_at\n1,3.5,9.5\n")
    events = tmp_path / "events.jsonl"
    out = ddiloco(
        "sim",
        "--model-size",
        "tiny",
        "--seq-len",
        "16",
        "--batch-size",
        "4",
        "--tokens",
        "4000",
        "--learners",
        "3",
        "--fragments",
        "2",
        "--sync-every",
        "4",
        "--data",
        shakespeare,
        "--failures",
        str(trace),
        "--events",
        str(events),
        "--quiet",
    )
    assert out.returncode == 0, out.stderr
    records = [json.loads(line) for line in events.read_text().splitlines()]
    kinds = [r["kind"] for r in records]
    assert kinds.count("merge") >= 3 and "down" in kinds
    down = next(r for r in records if r["kind"] == "down")
    assert down == {"t": 3.5, "kind": "down", "learner": 1}
    rejoined = [r for r in records if r["kind"] == "join" and r["learner"] == 1 and r["t"] > 9]
    assert len(rejoined) == 1
    merged = next(r for r in records if r["kind"] == "merge")
    assert {"fragment", "version", "learners", "expected", "quorum_seconds", "grace_seconds"} <= set(merged)


@pytest.mark.slow  # a whole run on the virtual clock or in processes: minutes under load on 2 cores
def test_bpe_tokenizer_option(shakespeare):
    out = ddiloco(
        "sim",
        "--model-size",
        "tiny",
        "--seq-len",
        "16",
        "--batch-size",
        "4",
        "--tokens",
        "2000",
        "--learners",
        "2",
        "--fragments",
        "2",
        "--sync-every",
        "4",
        "--tokenizer",
        "bpe",
        "--bpe-vocab",
        "300",
        "--data",
        shakespeare,
        "--json",
        "--quiet",
    )
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout.strip().splitlines()[-1])["eval_loss"] > 0


def test_vision_reports_accuracy():
    out = ddiloco(
        "sim",
        "--model",
        "vision",
        "--model-size",
        "tiny",
        "--tokens",
        "2000",
        "--learners",
        "2",
        "--fragments",
        "2",
        "--sync-every",
        "4",
        "--json",
        "--quiet",
    )
    assert out.returncode == 0, out.stderr
    result = json.loads(out.stdout.strip().splitlines()[-1])
    assert 0 <= result["eval_accuracy"] <= 1 and result["eval_loss"] > 0


@pytest.mark.parametrize(
    "args, message",
    [
        (["--method", "magic"], "'magic' is not one of 'decoupled', 'diloco', 'ddp', 'elastic-ddp'"),
        (["--fragments", "30", "--sync-every", "24"], "fragments"),
        (["--speeds", "1,2"], "--speeds gives 2"),
        (["--data", "/nonexistent/text"], "/nonexistent/text"),
        (["--failures", "/nonexistent.csv"], "does not exist"),
        (["--tokenizer", "words"], "tokenizer"),
    ],
)
def test_bad_flags_fail_with_a_clear_message(args, message):
    out = ddiloco("sim", "--model-size", "tiny", "--tokens", "100", *args)
    assert out.returncode == 2
    assert message in out.stderr


@pytest.mark.slow  # a whole run on the virtual clock or in processes: minutes under load on 2 cores
def test_codec_sends_outer_gradients_through_the_wire_codec(shakespeare):
    """--codec int4 puts about a seventh of fp32's bytes on the simulated link (4 bits plus block scales)."""
    peak = {}
    for codec in ("fp32", "int4"):
        out = ddiloco(
            "sim",
            "--model-size",
            "tiny",
            "--seq-len",
            "16",
            "--batch-size",
            "4",
            "--tokens",
            "3000",
            "--learners",
            "2",
            "--sync-every",
            "4",
            "--fragments",
            "2",
            "--data",
            shakespeare,
            "--json",
            "--quiet",
            *(["--codec", codec] if codec else []),
        )
        assert out.returncode == 0, out.stderr
        result = json.loads(out.stdout.strip().splitlines()[-1])
        assert result["contributions"] > 0
        peak[codec] = result["peak_step_bytes"]
    assert 0 < peak["int4"] < peak["fp32"] / 4
    bad = ddiloco("sim", "--codec", "int3", "--tokens", "1000")
    assert bad.returncode == 2 and "--codec" in bad.stderr


def test_the_link_flags_are_in_run_s_units(monkeypatch):
    """`ddiloco sim --net-latency` is milliseconds and `--net-bandwidth` MB/s, as `ddiloco run`'s
    (sim's `--bandwidth` was bytes per second: one name and one unit per setting)."""
    from ddiloco.cli import sim as sim_cli
    from ddiloco.sim.hardware import LinkModel

    from .test_algorithm_reach import FakeTask, parse

    monkeypatch.setattr("ddiloco.sim.run.build_task", lambda config: FakeTask())
    config, _ = sim_cli._sim_config(parse(sim_cli.SimFlags, ["--net-latency", "20", "--net-bandwidth", "5"]))
    assert (config.link.latency, config.link.bandwidth) == (0.02, 5e6)
    config, _ = sim_cli._sim_config(parse(sim_cli.SimFlags, []))
    assert (config.link.latency, config.link.bandwidth) == (LinkModel().latency, LinkModel().bandwidth)
    config, _ = sim_cli._sim_config(parse(sim_cli.SimFlags, ["--net-bandwidth", "0"]))  # no cap
    assert config.link.transfer(1e12) == config.link.latency
