"""One real `ddiloco synchronizer` process for `synchronizer_scale.py`: the process, M registered
sessions with their update streams, and the probe process that times heartbeats meanwhile (in a
process of its own, so that its timings do not wait for this interpreter)."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
from pathlib import Path

import torch
from safetensors.torch import save_file

from ddiloco.launch.procs import ProcessTable, ddiloco_command
from ddiloco.wire import framing, reassembly, rpc, sockets
from ddiloco.wire.protocol import signature

FRAGMENTS = 4
LOG_LEVEL = "error"
CHUNK = framing.DEFAULT_CHUNK_BYTES


def sync_every(fragments: int) -> int:
    """H: 4, or P where P is larger (each fragment needs its own offset in 0..H-1)."""
    return max(4, fragments)


def synchronizer_command(
    init: Path,
    folder: Path,
    learners: int,
    bulk_socket: bool,
    fragments: int = FRAGMENTS,
    shard: int = 0,
    shards: int = 1,
    threads: int = 0,
) -> list[str]:
    """Shard `shard` of `shards` (P = `fragments`, K = M, no grace, write-ahead checkpoints every
    merge), its address, checkpoints and events in `folder`; `threads`: torch's (0: its default)."""
    return ddiloco_command(
        "synchronizer",
        "--port",
        "0",
        "--address-file",
        str(folder / "address"),
        "--init",
        str(init),
        "--fragments",
        str(fragments),
        "--shard",
        str(shard),
        "--num-shards",
        str(shards),
        "--sync-every",
        str(sync_every(fragments)),
        "--overlap",
        "1",
        "--quorum",
        str(learners),
        "--grace",
        "0",
        "--learners",
        str(learners),
        "--max-learners",
        str(learners),
        "--heartbeat",
        "5",
        "--checkpoint-dir",
        str(folder / "ckpt"),
        "--event-log",
        str(folder / "events.jsonl"),
        "--log-level",
        LOG_LEVEL,
        "--no-exit-when-done",
        "--no-dashboard",
        "--threads",
        str(threads),
        *([] if bulk_socket else ["--no-bulk-socket"]),
    )


class Run:
    """One synchronizer process and M registered sessions with their subscriber streams."""

    def __init__(
        self, procs: ProcessTable, tmp: Path, params: dict[str, torch.Tensor], learners: int, bulk_socket: bool = True
    ) -> None:
        save_file(params, str(tmp / "init.safetensors"))
        cmd = synchronizer_command(tmp / "init.safetensors", tmp, learners, bulk_socket)
        self.child = procs.start("sync", cmd, tmp / "sync.log")
        deadline = time.monotonic() + 300
        while not (tmp / "address").is_file():
            if not self.child.alive() or time.monotonic() > deadline:
                raise RuntimeError(f"the synchronizer did not start: {(tmp / 'sync.log').read_text()[-2000:]}")
            time.sleep(0.05)
        address = self.address = (tmp / "address").read_text().strip()
        self.control = rpc.Stubs(rpc.open_channel(address, "control", CHUNK + rpc.FRAME_MARGIN), None)
        self.bulk = rpc.Stubs(rpc.open_channel(address, "bulk", CHUNK + rpc.FRAME_MARGIN), None)
        sig = signature(params)
        replies = [
            framing.read_message(
                self.control.call(
                    "Register",
                    framing.message({"learner": m, "incarnation": f"bench{m}", "signature": sig, "fresh": True}),
                    60,
                )
            )
            for m in range(learners)
        ]
        self.sessions = [r["session"] for r in replies]
        host = address.rpartition(":")[0]
        self.socket = (
            sockets.BulkSocketClient(host, replies[0]["bulk_port"], None, CHUNK + rpc.FRAME_MARGIN)
            if bulk_socket
            else None
        )
        self.arrived: dict[tuple[int, int, int], float] = {}  # (learner, fragment, version) -> time
        self.cond = threading.Condition()
        self.streams = [threading.Thread(target=self._subscribe, args=(m,), daemon=True) for m in range(learners)]
        for t in self.streams:
            t.start()

    def _subscribe(self, m: int) -> None:
        r = reassembly.Reassembler(1 << 40)
        try:
            for frame in self.bulk.subscribe(framing.message({"session": self.sessions[m]})):
                msg = r.feed(frame)
                if msg is not None and msg.head.get("kind") == "update":
                    with self.cond:
                        self.arrived[(m, msg.head["fragment"], int(msg.head["version"]))] = time.perf_counter()
                        self.cond.notify_all()
        except Exception:  # the stream ends when the synchronizer stops
            return

    def wait_updates(self, fragment: int, version: int, timeout: float) -> float:
        keys = [(m, fragment, version) for m in range(len(self.sessions))]
        with self.cond:
            if not self.cond.wait_for(lambda: all(k in self.arrived for k in keys), timeout):
                raise TimeoutError(f"fragment {fragment} version {version} never arrived")
            return max(self.arrived[k] for k in keys)

    def push(self, m: int, fragment: int, version: int, grads: dict[str, torch.Tensor]) -> None:
        head = {
            "kind": "contribution",
            "session": self.sessions[m],
            "fragment": fragment,
            "base_version": version,
            "steps": 4,
            "tokens": 1024,
            "seconds": 1.0,
            "step_time": 0.25,
            "step": 4 * (version + 1),
            "position": 0,
        }
        if self.socket is not None:  # as a learner sends on the bulk socket plane
            reply, _ = self.socket.push(framing.iter_frame_parts(head, grads, "bf16", CHUNK), 600)
        else:  # as a learner sends over gRPC: each frame made as gRPC asks for it
            reply = framing.read_message(
                self.bulk.push(framing.iter_tensor_frames(head, grads, "bf16", CHUNK), timeout=600)
            )
        if not reply.get("ok"):
            raise RuntimeError(f"push refused: {reply}")


PROBE = r"""
import json, os, sys, time
from ddiloco.wire import framing, rpc, sockets
address, sessions, stop_file = sys.argv[1], json.loads(sys.argv[2]), sys.argv[3]
control = rpc.Stubs(rpc.open_channel(address, "control", 1 << 20), None)
control.call("Heartbeat", framing.message({"session": sessions[0]}), 30)
print("ready", flush=True)
latencies, i, end = [], 0, time.monotonic() + 3600
while time.monotonic() < end and not os.path.exists(stop_file):
    t0 = time.perf_counter()
    control.call("Heartbeat", framing.message({"session": sessions[i % len(sessions)]}), 30)
    latencies.append(time.perf_counter() - t0)
    i += 1
    time.sleep(0.01)
print(json.dumps(latencies))
"""


def start_probe(run: Run, stop_file: Path) -> subprocess.Popen:
    """Heartbeats from their own process, as a learner's come: this one's pushes do not delay them."""
    probe = subprocess.Popen(
        [sys.executable, "-c", PROBE, run.address, json.dumps(run.sessions), str(stop_file)],
        stdout=subprocess.PIPE,
        text=True,
    )
    if probe.stdout.readline().strip() != "ready":
        raise RuntimeError("the heartbeat probe did not start")
    return probe
