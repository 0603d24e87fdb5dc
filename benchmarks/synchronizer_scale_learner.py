"""A learner stand-in for `synchronizer_scale.py --shards N`: one process that registers with every shard,
subscribes to each shard's updates, and for each round pushes every fragment's synthetic outer gradient
(the fragment's real shapes, bf16 on the wire) to the shard that owns it, then waits until that
fragment's merged update has arrived before pushing the next. A round closes only when all M have
pushed (quorum M, no grace), so the merges themselves keep the M stand-ins in step.

    python synchronizer_scale_learner.py SPEC.json    # written by synchronizer_scale_shards.py

It writes `ready-M.json` (its session on every shard) beside the spec, waits for `go`, and writes
`times-M.json`: per fragment and round, when its push was answered and when the update arrived
(time.monotonic, one clock for every process on the machine).
"""

from __future__ import annotations

import json
import os
import sys
import threading
import time
from pathlib import Path

import torch

from ddiloco.records.atomic import atomic_write_json
from ddiloco.wire import framing, rpc, sockets

CHUNK = framing.DEFAULT_CHUNK_BYTES
WAIT_S = 900  # the longest wait for one update, for the go file, or for one push's reply
# Learners run on machines of their own: here they stand aside for the synchronizer's processes and the
# heartbeat probe on the same cores (without it, p99 heartbeats include waits for a stand-in's time slice).
NICE = 10


class Shard:
    """This stand-in's session on one shard, and the updates that arrived from it."""

    def __init__(self, address: str, learner: int, sig: str, bulk_socket: bool) -> None:
        self.control = rpc.Stubs(rpc.open_channel(address, "control", CHUNK + rpc.FRAME_MARGIN), None)
        self.bulk = rpc.Stubs(rpc.open_channel(address, "bulk", CHUNK + rpc.FRAME_MARGIN), None)
        msg = {"learner": learner, "incarnation": f"bench{learner}", "signature": sig, "fresh": True}
        reply = framing.read_message(self.control.call("Register", framing.message(msg), 60))
        self.session = reply["session"]
        host = address.rpartition(":")[0]
        self.socket = (
            sockets.BulkSocketClient(host, reply["bulk_port"], None, CHUNK + rpc.FRAME_MARGIN) if bulk_socket else None
        )
        self.arrived: dict[tuple[int, int], float] = {}  # (fragment, version) -> time.monotonic()
        self.cond = threading.Condition()
        threading.Thread(target=self._subscribe, daemon=True).start()

    def _subscribe(self) -> None:
        """Every frame is received and its bytes counted, but not kept: a stand-in needs only to know
        when each update's last byte arrived (four stand-ins reassembling 1B parameters' updates
        took 4-5 GB of the machine)."""
        heads: dict[int, dict] = {}  # message id -> its head, while its frames arrive
        got: dict[int, int] = {}  # message id -> body bytes so far
        try:
            for data in self.bulk.subscribe(framing.message({"session": self.session})):
                frame, body = framing.unpack_frame(data)
                msg = frame["msg"]
                if frame["part"] == 0:
                    heads[msg], got[msg] = frame["head"], 0
                got[msg] += len(body)
                if frame["part"] + 1 < frame["parts"]:
                    continue
                head, nbytes = heads.pop(msg), got.pop(msg)
                if nbytes != head["nbytes"]:
                    raise RuntimeError(f"an update of {nbytes} bytes declared {head['nbytes']}")
                if head.get("kind") == "update":
                    with self.cond:
                        self.arrived[(head["fragment"], int(head["version"]))] = time.monotonic()
                        self.cond.notify_all()
        except Exception:  # the stream ends when the shard stops
            return

    def push(self, fragment: int, version: int, grads: dict[str, torch.Tensor], steps: int) -> None:
        head = {
            "kind": "contribution",
            "session": self.session,
            "fragment": fragment,
            "base_version": version,
            "steps": steps,
            "tokens": 1024,
            "seconds": 1.0,
            "step_time": 1.0 / steps,
            "step": steps * (version + 1),
            "position": 0,
        }
        if self.socket is not None:  # as a learner sends on the bulk socket plane
            reply, _ = self.socket.push(framing.iter_frame_parts(head, grads, "bf16", CHUNK), WAIT_S)
        else:  # as a learner sends over gRPC
            reply = framing.read_message(
                self.bulk.push(framing.iter_tensor_frames(head, grads, "bf16", CHUNK), timeout=WAIT_S)
            )
        if not reply.get("ok"):
            raise RuntimeError(f"push refused: {reply}")

    def wait(self, fragment: int, version: int) -> float:
        with self.cond:
            if not self.cond.wait_for(lambda: (fragment, version) in self.arrived, WAIT_S):
                raise TimeoutError(f"fragment {fragment} version {version} never arrived")
            return self.arrived[(fragment, version)]


def main() -> None:
    os.nice(NICE)
    spec_path = Path(sys.argv[1])
    spec = json.loads(spec_path.read_text())
    folder, m = spec_path.parent, int(sys.argv[2])
    torch.manual_seed(m)
    shards = [Shard(a, m, spec["signature"], spec["bulk_socket"]) for a in spec["addresses"]]
    atomic_write_json(folder / f"ready-{m}.json", {"sessions": [s.session for s in shards]})
    deadline = time.monotonic() + WAIT_S
    while not (folder / "go").exists():
        if time.monotonic() > deadline:
            raise TimeoutError("no go")
        time.sleep(0.05)
    values: dict[tuple[int, ...], torch.Tensor] = {}  # one synthetic gradient per shape, shared by fragments
    times = []
    for r in range(spec["rounds"]):
        for frag in spec["fragments"]:
            for shape in frag["shapes"].values():
                if tuple(shape) not in values:
                    values[tuple(shape)] = torch.randn(shape).mul_(1e-3).bfloat16()
            grads = {name: values[tuple(shape)] for name, shape in frag["shapes"].items()}
            shard = shards[frag["shard"]]
            shard.push(frag["index"], r, grads, spec["sync_every"])
            pushed = time.monotonic()
            times.append(
                {"fragment": frag["index"], "round": r, "pushed": pushed, "arrived": shard.wait(frag["index"], r + 1)}
            )
    atomic_write_json(folder / f"times-{m}.json", times)


if __name__ == "__main__":
    main()
