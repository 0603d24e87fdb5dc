"""`synchronizer_scale.py --shards N`: the model sharded over N real `ddiloco synchronizer` processes, as a
sharded run places it (P = 4 fragments per shard, fragment p on shard p mod N), and M learner stand-in
processes (`synchronizer_scale_learner.py`) that push synthetic outer gradients of the real fragment
sizes to every shard and fetch the merged fragments. The synchronizer is what is measured, per shard.

The initial parameters are written to the init file one tensor at a time, and every shard reads only
its own from it: at 1B parameters nothing holds the whole model in memory. A guard thread watches the
machine's available memory and ends the run (its own processes, by PID) before the machine would swap.
"""

from __future__ import annotations

import json
import math
import os
import shutil
import statistics
import struct
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import torch

from ddiloco.cli.options import shared_threads
from ddiloco.core import plan_for_model
from ddiloco.launch.procs import ProcessTable
from ddiloco.records.atomic import atomic_write_json
from ddiloco.records.events import read_events
from ddiloco.wire import framing, rpc
from ddiloco.wire.protocol import signature
from ddiloco.wire.routing import owned_fragments

HERE = Path(__file__).resolve().parent
FRAGMENTS_PER_SHARD = 4  # as the single synchronizer's P = 4: each shard runs what one synchronizer ran
MIN_AVAILABLE = 2 << 30  # the run ends when the machine has less memory available than this
WAIT_S = 1800  # the longest a run may take


def heartbeat_figures(lat: list[float]) -> dict[str, float]:
    """Heartbeat round trips (seconds, sorted) as the benchmark reports them: count, p50 and p99 in ms."""
    return {
        "heartbeats": len(lat),
        "heartbeat_p50_ms": lat[len(lat) // 2] * 1e3,
        "heartbeat_p99_ms": lat[min(len(lat) - 1, math.ceil(0.99 * len(lat)) - 1)] * 1e3,
    }


def shapes(params: int) -> dict[str, tuple[int, ...]]:
    """The layout of `synchronizer_scale.model`: 16 matrices of 1024 columns and a bias each, by name."""
    rows = max(1, params // (16 * 1024))
    return {
        f"layer{i}.{kind}": (rows, 1024) if kind == "weight" else (1024,)
        for i in range(16)
        for kind in ("weight", "bias")
    }


def write_init(path: Path, params: int) -> dict[str, tuple[int, ...]]:
    """A safetensors file of the model (weights N(0, 0.02), zero biases, float32, names sorted), written one
    tensor at a time so that only one is ever in memory. Returns the shapes by name."""
    layout = dict(sorted(shapes(params).items()))
    header, offset = {}, 0
    for name, shape in layout.items():
        nbytes = math.prod(shape) * 4
        header[name] = {"dtype": "F32", "shape": list(shape), "data_offsets": [offset, offset + nbytes]}
        offset += nbytes
    head = json.dumps(header, separators=(",", ":")).encode()
    head += b" " * (-len(head) % 8)  # the format aligns the data to 8 bytes
    gen = torch.Generator().manual_seed(0)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(head)) + head)
        for name, shape in layout.items():
            t = torch.randn(shape, generator=gen).mul_(0.02) if name.endswith("weight") else torch.zeros(shape)
            f.write(t.numpy().tobytes())
    return layout


def need_bytes(owned: int, largest: int, learners: int) -> int:
    """What a shard must hold, in bytes: its `owned` parameters and their outer momentum in fp32, one
    incoming contribution per learner of its `largest` fragment in bf16, and that fragment's fp32 sum."""
    return owned * 8 + largest * (2 * learners + 4)


def available_bytes() -> int:
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemAvailable:"):
            return int(line.split()[1]) * 1024
    raise RuntimeError("no MemAvailable in /proc/meminfo")


class MemoryGuard(threading.Thread):
    """Kills this run's processes (by PID) if the machine's available memory falls below MIN_AVAILABLE;
    records the lowest it saw (what the run took of the machine: `start - lowest`)."""

    def __init__(self, procs: ProcessTable) -> None:
        super().__init__(daemon=True)
        self.procs = procs
        self.start_available = self.lowest = available_bytes()
        self.tripped = False
        self.stop = threading.Event()

    def run(self) -> None:
        while not self.stop.wait(0.2):
            self.lowest = min(self.lowest, available := available_bytes())
            if available < MIN_AVAILABLE:
                self.tripped = True
                for child in self.procs.children:
                    child.signal(9)
                return


PROBE = r"""
import json, os, sys, time
from ddiloco.wire import framing, rpc
targets, stop_file = json.loads(sys.argv[1]), sys.argv[2]
controls = [rpc.Stubs(rpc.open_channel(address, "control", 1 << 20), None) for address, _ in targets]
for c, (_, session) in zip(controls, targets):
    c.call("Heartbeat", framing.message({"session": session}), 30)
print("ready", flush=True)
latencies, end = [[] for _ in targets], time.monotonic() + 3600
while time.monotonic() < end and not os.path.exists(stop_file):
    for lat, c, (_, session) in zip(latencies, controls, targets):
        t0 = time.monotonic()
        c.call("Heartbeat", framing.message({"session": session}), 30)
        lat.append((t0, time.monotonic() - t0))
    time.sleep(0.01)
print(json.dumps(latencies))
"""


def _start_shard(procs: ProcessTable, folder: Path, cmd: list[str]) -> object:
    """One shard, started and listening (shards start one after another: each reads the init file)."""
    folder.mkdir(parents=True)
    child = procs.start(folder.name, cmd, folder / "sync.log")
    deadline = time.monotonic() + 600
    while not (folder / "address").is_file():
        if not child.alive() or time.monotonic() > deadline:
            raise RuntimeError(f"shard {folder.name} did not start: {(folder / 'sync.log').read_text()[-2000:]}")
        time.sleep(0.05)
    return child


def measure_sharded(
    params_count: int,
    learners: int,
    shards: int,
    rounds: int,
    memcpy: float,
    idle_rss: int,
    raw_write_seconds,  # noqa: ANN001  # synchronizer_scale.raw_write_seconds
    peak_rss,  # noqa: ANN001  # synchronizer_scale.peak_rss
    bulk_socket: bool = True,
    keep: Path | None = None,
) -> dict:
    """One sharded run; its row: per shard the single synchronizer's figures, and the worst of them.
    `keep`: a folder for the raw timings (heartbeats, the learners' pushes and arrivals, the events)."""
    from synchronizer_scale_run import sync_every, synchronizer_command

    fragments = FRAGMENTS_PER_SHARD * shards
    load_before = os.getloadavg()[0]
    procs = ProcessTable()
    guard = MemoryGuard(procs)
    guard.start()
    with tempfile.TemporaryDirectory(prefix="sync-scale-") as tmp_name:
        tmp = Path(tmp_name)
        layout = write_init(tmp / "init.safetensors", params_count)
        meta = {n: torch.empty(s, device="meta") for n, s in layout.items()}
        plan = plan_for_model(meta, fragments)  # as every shard makes it from the file
        owned = [owned_fragments(s, shards, fragments) for s in range(shards)]
        largest = max(plan.sizes)
        raw_writes = _raw_writes(raw_write_seconds, tmp, largest * 8)  # one fragment's params + momentum, fp32
        try:
            children = [
                _start_shard(
                    procs,
                    tmp / f"sync-{s}",
                    synchronizer_command(
                        tmp / "init.safetensors",
                        tmp / f"sync-{s}",
                        learners,
                        bulk_socket,
                        fragments,
                        s,
                        shards,
                        shared_threads(0, shards),  # as `ddiloco run` shares the cores among its processes
                    ),
                )
                for s in range(shards)
            ]
            addresses = [(tmp / f"sync-{s}" / "address").read_text().strip() for s in range(shards)]
            idle = _idle_synchronizer(procs, tmp / "idle", bulk_socket, synchronizer_command, shared_threads(0, shards))
            spec = {
                "addresses": addresses,
                "signature": signature(meta),
                "bulk_socket": bulk_socket,
                "sync_every": sync_every(fragments),
                "rounds": rounds + 1,  # round 0 warms up every fragment and is not counted
                "fragments": [
                    {"index": p, "shard": p % shards, "shapes": {n: list(layout[n]) for n in plan.names[p]}}
                    for p in range(fragments)
                ],
            }
            atomic_write_json(tmp / "spec.json", spec)
            standins = [
                procs.start(
                    f"learner-{m}",
                    [sys.executable, str(HERE / "synchronizer_scale_learner.py"), str(tmp / "spec.json"), str(m)],
                    tmp / f"learner-{m}.log",
                )
                for m in range(learners)
            ]
            sessions = _await_ready(tmp, standins, learners)
            probe = subprocess.Popen(
                [
                    sys.executable,
                    "-c",
                    PROBE,
                    json.dumps([*zip(addresses, sessions[0], strict=True), idle]),
                    str(tmp / "stop-probe"),
                ],
                stdout=subprocess.PIPE,
                text=True,
            )
            if probe.stdout is None or probe.stdout.readline().strip() != "ready":
                raise RuntimeError("the heartbeat probe did not start")
            (tmp / "go").touch()
            _await_exit(standins, tmp, guard)
            (tmp / "stop-probe").touch()
            timed = json.loads(probe.communicate(timeout=60)[0].strip().splitlines()[-1])  # per shard (sent, took)
            latencies = [[took for _, took in shard] for shard in timed]  # the shards', then the idle one's
            rss = [peak_rss(c.pid) for c in children]
        finally:
            guard.stop.set()
            procs.stop_all()
        raw_writes += _raw_writes(raw_write_seconds, tmp, largest * 8)
        raw_write, fastest = statistics.median(raw_writes), min(raw_writes)
        times = [json.loads((tmp / f"times-{m}.json").read_text()) for m in range(learners)]
        events = [list(read_events(tmp / f"sync-{s}" / "events.jsonl")) for s in range(shards)]
        if keep is not None:  # what the figures come from, to look into
            keep.mkdir(parents=True, exist_ok=True)
            atomic_write_json(keep / "heartbeats.json", timed, durable=False)
            atomic_write_json(keep / "learners.json", times, durable=False)
            for s in range(shards):
                shutil.copy(tmp / f"sync-{s}" / "events.jsonl", keep / f"events-{s}.jsonl")
    delivered: dict[int, list[float]] = {}
    for p in range(fragments):
        for r in range(1, rounds + 1):
            mine = [t for ts in times for t in ts if t["fragment"] == p and t["round"] == r]
            delivered.setdefault(p % shards, []).append(
                max(t["arrived"] for t in mine) - max(t["pushed"] for t in mine)
            )
    per_shard = [
        _shard_row(
            s,
            owned[s],
            plan.sizes,
            learners,
            events[s],
            latencies[s],
            rss[s],
            delivered[s],
            memcpy,
            (raw_write, fastest),
            idle_rss,
        )
        for s in range(shards)
    ]
    baseline = sorted(latencies[-1])
    worst = {
        key: max(r[key] for r in per_shard)
        for key in (
            "round_vs_fastest_limit",
            "round_ms",
            "round_vs_limit",
            "round_vs_memcpy",
            "heartbeat_p99_ms",
            "peak_rss_over_need",
            "checkpoint_ms",
        )
    }
    return {
        "load_average": [load_before, os.getloadavg()[0]],  # the machine's, before and after: it is shared
        "params": sum(plan.sizes),
        "learners": learners,
        "shards": shards,
        "fragments": fragments,
        "rounds": rounds,
        "plane": "socket" if bulk_socket else "grpc",
        "raw_write_ms": raw_write * 1e3,
        "raw_write_fastest_ms": fastest * 1e3,
        "machine_used_gb": (guard.start_available - guard.lowest) / 1e9,
        # an idle synchronizer's heartbeats, timed by the same probe meanwhile: what this machine's
        # scheduling alone costs a heartbeat (2 cores, shared), with no merge anywhere in its process
        "idle_heartbeat_p50_ms": baseline[len(baseline) // 2] * 1e3,
        "idle_heartbeat_p99_ms": baseline[min(len(baseline) - 1, math.ceil(0.99 * len(baseline)) - 1)] * 1e3,
        "per_shard": per_shard,
        **worst,
    }


def _raw_writes(raw_write_seconds, folder: Path, nbytes: int) -> list[float]:  # noqa: ANN001
    """The raw write's times on a disk with nothing else to write back: the init file (GBs at 1B) and
    the rounds' checkpoints are flushed first, else each fsync waits behind them and the limit the
    rounds are held to is too slow."""
    os.sync()
    return raw_write_seconds(folder, nbytes)


def _idle_synchronizer(procs: ProcessTable, folder: Path, bulk_socket: bool, command, threads: int) -> tuple[str, str]:  # noqa: ANN001
    """A synchronizer of a small model that merges nothing, with one registered session: the probe's
    baseline. Returns its address and the session."""
    folder.mkdir()
    layout = write_init(folder / "init.safetensors", 16 * 1024)
    _start_shard(
        procs, folder / "sync", command(folder / "init.safetensors", folder / "sync", 1, bulk_socket, threads=threads)
    )
    address = (folder / "sync" / "address").read_text().strip()
    meta = {n: torch.empty(s, device="meta") for n, s in layout.items()}
    control = rpc.Stubs(rpc.open_channel(address, "control", 1 << 20), None)
    msg = {"learner": 0, "incarnation": "idle", "signature": signature(meta), "fresh": True}
    return address, framing.read_message(control.call("Register", framing.message(msg), 60))["session"]


def _await_ready(tmp: Path, standins: list, learners: int) -> list[list[str]]:
    """Every stand-in's sessions, once each has registered with every shard."""
    deadline = time.monotonic() + 600
    while not all((tmp / f"ready-{m}.json").is_file() for m in range(learners)):
        for m, c in enumerate(standins):
            if not c.alive():
                raise RuntimeError(f"learner stand-in {m} ended: {(tmp / f'learner-{m}.log').read_text()[-2000:]}")
        if time.monotonic() > deadline:
            raise TimeoutError("the learner stand-ins did not register")
        time.sleep(0.05)
    return [json.loads((tmp / f"ready-{m}.json").read_text())["sessions"] for m in range(learners)]


def _await_exit(standins: list, tmp: Path, guard: MemoryGuard) -> None:
    deadline = time.monotonic() + WAIT_S
    while any(c.alive() for c in standins):
        if guard.tripped:
            raise RuntimeError(f"stopped: the machine's available memory fell below {MIN_AVAILABLE >> 30} GiB")
        if time.monotonic() > deadline:
            raise TimeoutError(f"the rounds took over {WAIT_S} s")
        time.sleep(0.1)
    for m, c in enumerate(standins):
        if c.poll() != 0:
            raise RuntimeError(f"learner stand-in {m} failed: {(tmp / f'learner-{m}.log').read_text()[-2000:]}")


def _shard_row(
    shard: int,
    owned: list[int],
    sizes: tuple[int, ...],
    learners: int,
    events: list[dict],
    latencies: list[float],
    rss: int,
    delivered: list[float],
    memcpy: float,
    raw: tuple[float, float],
    idle_rss: int,
) -> dict:
    """One shard's figures, as `synchronizer_scale.measure` computes them for a single synchronizer.
    `raw`: the raw write's median and fastest time (this disk writes its first GB or so fast, then at
    a fraction of that: `round_vs_fastest_limit` holds the round to the fast one)."""
    raw_write, fastest = raw
    sent = [e for e in events if e["kind"] == "sent" and e["version"] >= 2]
    round_s = statistics.median(e["round_seconds"] for e in sent)
    merged = statistics.median(e["merged_seconds"] for e in sent)
    writes = [e["write_seconds"] for e in events if e["kind"] == "checkpoint" and e.get("write_seconds")]
    frag = statistics.mean(sizes[p] for p in owned)
    copy_s = frag * (2 * learners + 4 + 4 + 4) / (memcpy * 1e9)  # contributions bf16; params, momentum, update
    need = need_bytes(sum(sizes[p] for p in owned), max(sizes[p] for p in owned), learners)
    lat = sorted(latencies)
    return {
        "shard": shard,
        "owned_params": sum(sizes[p] for p in owned),
        "fragment_mb": frag * 4 / 1e6,
        "round_ms": round_s * 1e3,
        "round_vs_memcpy": round_s / copy_s,
        "round_vs_limit": round_s / (copy_s + raw_write),
        "round_vs_fastest_limit": round_s / (copy_s + fastest),
        "merged_ms": merged * 1e3,
        "delivered_ms": statistics.median(delivered) * 1e3,
        "checkpoint_ms": statistics.median(writes) * 1e3,
        "checkpoint_vs_raw": statistics.median(writes) / raw_write,
        **heartbeat_figures(lat),
        "heartbeat_max_ms": lat[-1] * 1e3,
        "heartbeats_over_50ms": sum(x > 0.05 for x in lat),
        "peak_rss_mb": rss / 1e6,
        "need_mb": need / 1e6,
        "peak_rss_over_need": (rss - idle_rss) / need,
    }
