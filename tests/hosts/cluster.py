"""A ddiloco run spread over hosts for the partition tests: synchronizer shards on hosts `sync0`...,
learners on `learner0`..., each process started with `net.popen` (so the network stops it), and
readers of what the shards recorded. Every wait has a timeout."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

from ddiloco.records.atomic import read_json
from ddiloco.records.events import read_events

from ..support.processes import model_args
from ..support.runtime import wait_for

HEARTBEAT = 0.2  # failure timeout 6 h = 1.2 s, rpc deadline 2 h = 0.4 s
FAILURE = 6 * HEARTBEAT
GRACE = 0.5  # --grace: how long a round waits after its quorum for more work
STEP_S = 0.05  # --min-step-seconds: steps are padded to this, so a run lasts as long as the test needs
SYNC_EVERY = 4
TOKEN = "hosts-partition-secret"


def names(learners: int, shards: int) -> list[str]:
    return [*(f"sync{s}" for s in range(shards)), *(f"learner{m}" for m in range(learners))]


class Cluster:
    """`shards` synchronizer shards and `learners` learners; the run ends after `duration` seconds (or
    `tokens` trained). `by_file`: learners connect with @FILE (the shards' address files, where a
    finished shard leaves its mark); `sync_args`, `learner_args`: more flags for every shard, learner."""

    def __init__(
        self,
        net,
        tmp: Path,
        data: str,
        *,
        learners: int = 2,
        shards: int = 1,
        duration: float = 40,
        tokens: int | None = None,
        by_file: bool = False,
        sync_args: tuple[str, ...] = (),
        learner_args: tuple[str, ...] = (),
    ) -> None:
        self.net, self.tmp, self.learners, self.shards = net, tmp, learners, shards
        budget = ("--tokens", str(tokens)) if tokens is not None else ("--duration", str(duration))
        env = {**os.environ, "DDILOCO_TOKEN": TOKEN}
        self.sync: list[subprocess.Popen] = []
        for s in range(shards):
            d = self.sync_dir(s)
            d.mkdir(parents=True)
            cmd = _ddiloco(
                "synchronizer",
                *("--host", net.address(f"sync{s}"), "--port", "0", "--address-file", str(d / "address")),
                *model_args(data, learners),
                *("--fragments", "4", "--sync-every", str(SYNC_EVERY), "--overlap", "2", "--quorum", str(learners)),
                *("--grace", str(GRACE), "--heartbeat", str(HEARTBEAT), *budget, *sync_args),
                *("--shard", str(s), "--num-shards", str(shards), "--max-learners", str(learners)),
                *("--checkpoint-dir", str(d), "--event-log", str(d / "events.jsonl")),
                *("--summary", str(d / "summary.json")),
            )
            with open(d / "stderr.log", "wb") as err:
                self.sync.append(net.popen(f"sync{s}", cmd, env=env, stdout=err, stderr=err))
        addresses = [self._address(s) for s in range(shards)]
        if by_file:
            addresses = [f"@{self.sync_dir(s) / 'address'}" for s in range(shards)]
        self.learner_procs: list[subprocess.Popen] = []
        for m in range(learners):
            d = tmp / f"learner-{m}"
            d.mkdir()
            cmd = _ddiloco(
                "learner",
                *("--connect", ",".join(addresses), "--id", str(m)),
                *model_args(data, learners),
                *("--batch-size", "4", "--threads", "1", "--state-dir", str(d)),
                *("--min-step-seconds", str(STEP_S), "--log-level", "info", *learner_args),
            )
            with open(d / "stderr.log", "wb") as err:
                self.learner_procs.append(net.popen(f"learner{m}", cmd, env=env, stdout=err, stderr=err))

    def _address(self, s: int) -> str:
        path = self.sync_dir(s) / "address"
        return wait_for(lambda: path.is_file() and path.read_text(), 120, message=f"shard {s}'s address")

    def sync_dir(self, s: int) -> Path:
        return self.tmp / f"sync-{s}"

    def events(self, s: int = 0) -> list[dict]:
        path = self.sync_dir(s) / "events.jsonl"
        return read_events(path) if path.is_file() else []

    def merges(self, learner: int, s: int = 0, after: float = 0.0) -> list[dict]:
        """Merges by shard `s` that took work of `learner`, at or after wall time `after`."""
        return [e for e in self.events(s) if e["kind"] == "merge" and learner in e["learners"] and e["t"] >= after]

    def leaves(self, learner: int, s: int = 0) -> list[dict]:
        return [e for e in self.events(s) if e["kind"] == "leave" and e["learner"] == learner]

    def joins(self, learner: int, s: int = 0) -> list[dict]:
        return [e for e in self.events(s) if e["kind"] == "join" and e["learner"] == learner]

    def wait_merged(self, learner: int, s: int = 0, after: float = 0.0, timeout: float = 120) -> dict:
        return wait_for(lambda: self.merges(learner, s, after)[:1], timeout, message=f"a merge of learner {learner}")[0]

    def finish(self, timeout: float = 240) -> list[dict]:
        """Wait for every process to end by itself (code 0), then each shard's summary."""
        procs = [*self.learner_procs, *self.sync]
        deadline = time.monotonic() + timeout
        codes = [p.wait(timeout=max(1.0, deadline - time.monotonic())) for p in procs]
        logs = [p.read_text()[-2000:] for p in sorted(self.tmp.glob("*/stderr.log"))]
        assert codes == [0] * len(procs), (codes, *logs)
        return [read_json(self.sync_dir(s) / "summary.json") for s in range(self.shards)]


def longest_gap(times: list[float], start: float, stop: float) -> float:
    """The longest time within [start, stop] without any of `times`."""
    points = [start, *sorted(t for t in times if start < t < stop), stop]
    return max(b - a for a, b in zip(points, points[1:], strict=False))


def _ddiloco(*args: str) -> list[str]:
    return [sys.executable, "-m", "ddiloco", *args]
