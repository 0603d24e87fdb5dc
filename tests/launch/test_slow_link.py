"""Synchronous DiLoCo's whole-model pushes on an emulated link slower than the bulk deadline's
default 10 MB/s: `ddiloco run --net-bandwidth B` sizes the synchronizers' push deadline for B, and
their wire chunks so that each crosses the link well within the streams' idle limit, so the pushes
land and are merged instead of being cancelled halfway, round after round."""

import json

import pytest

from ddiloco.launch.config import NetworkConfig, RunConfig
from ddiloco.learner.wan import LinkConfig
from ddiloco.records.events import read_events

from .test_run import assert_all_ended, ddiloco_run


@pytest.mark.timeout(240)
def test_whole_model_pushes_on_a_slow_link_are_merged(tmp_path, shakespeare):
    # the tiny GPT's bf16 update (P = 1: the whole model) is about 88 KB: about 2.9 s at 0.03 MB/s,
    # where a deadline sized for 10 MB/s is rpc + 0.01 s + failure = 1.6 s at this heartbeat
    args = ["--method", "diloco", "--learners", "2", "--tokens", "3072", "--sync-every", "8"]
    args += ["--net-bandwidth", "0.03"]
    out, run_dir = ddiloco_run(tmp_path, shakespeare, *args, timeout=200)
    assert out.returncode == 0, out.stderr[-3000:]
    result = json.loads(out.stdout.strip().splitlines()[-1])
    assert_all_ended(run_dir)
    events = [e for d in run_dir.glob("sync-*") for e in read_events(d / "events.jsonl")]
    merges = [e for e in events if e.get("kind") == "merge"]
    assert len(merges) >= 2 and all(len(m["admitted"]) == 2 for m in merges)  # every round, both learners
    assert not [e for e in events if e.get("kind") in ("rejected", "refused")]
    assert result["tokens_merged"] > 0 and result["goodput"] > 0


def test_the_push_deadline_follows_the_emulated_link_or_the_flag(tmp_path):
    base = dict(run_dir=tmp_path, data=tmp_path / "d.txt", tokens=1000)

    def flag(config: RunConfig, name: str = "--min-bandwidth") -> str | None:
        value = config.synchronizer_settings(0)[name.removeprefix("--").replace("-", "_")]
        return None if value is None else str(value)

    def wan(latency: float, bandwidth: float, jitter: float, min_bandwidth: float | None = None) -> NetworkConfig:
        return NetworkConfig(link=LinkConfig(latency, bandwidth, jitter), min_bandwidth=min_bandwidth)

    assert flag(RunConfig(**base)) is None  # no link: the default 10 MB/s
    assert flag(RunConfig(**base, network=wan(100.0, 0.03, 0.0))) == "0.015"
    assert flag(RunConfig(**base, network=wan(100.0, 500.0, 0.0))) == "10.0"  # never above the default
    assert flag(RunConfig(**base, network=wan(0.0, 0.03, 0.0, 2.0))) == "2.0"
    # a wire chunk crosses the link in a quarter of the failure timeout (6 h = 3 s): 0.03 MB/s x 0.75 s
    assert flag(RunConfig(**base), "--chunk-bytes") is None
    assert flag(RunConfig(**base, network=wan(0.0, 0.03, 0.0)), "--chunk-bytes") == "22496"
    assert flag(RunConfig(**base, network=wan(0.0, 0.001, 0.0)), "--chunk-bytes") == "4096"  # at least 4 KiB
    assert flag(RunConfig(**base, network=wan(0.0, 500.0, 0.0)), "--chunk-bytes") == str(1 << 20)  # at most 1 MiB
