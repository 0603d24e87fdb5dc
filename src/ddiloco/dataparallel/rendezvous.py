"""Generations of one data-parallel job, agreed through a key-value store the launcher holds.

Why our own rendezvous and not torchrun's elastic agent: torchrun answers every membership change by
restarting every worker process (they import torch again and reload the checkpoint), its c10d store
lives inside one of the agents (when that node dies, the job goes with it), and a dead node is only
noticed after keep-alive timeouts. Here the store lives in the launcher, which outlives every worker;
the launcher sees a death at once (it is the parent) and names the next generation's members; the
survivors stay the same processes, leave the broken process group and form a new one with the state
they hold in memory. That is the elastic restart torchrun performs, without the process restarts.

Keys (all small text):

    gen             the newest generation the launcher opened (an integer)
    members/G       its members, in rank order (JSON list of worker slots; survivors first)
    hello/S         "PID" (or "PID INCARNATION" on Slurm: the job's restart count) of worker S once
                    it is ready to join (model built, checkpoint read)
    failed/S        the generation in which worker S saw a collective fail
    formed/G        written by rank 0 once generation G formed: world, step, tokens_merged
    stop            written by rank 0 when the budget is reached: the run is over

Workers reach the store on 127.0.0.1 by default; on Slurm, at the address `--sync-host` gives
(`dataparallel/slurm.py`). Every wait is bounded.
"""

from __future__ import annotations

import contextlib
import datetime
import json
import time
from collections.abc import Callable

import torch.distributed as dist

HOST = "127.0.0.1"
POLL = 0.05


def _timeout(seconds: float) -> datetime.timedelta:
    return datetime.timedelta(seconds=seconds)


class Coordinator:
    """The launcher's side: it hosts the store and opens generations."""

    def __init__(self, timeout: float = 30.0) -> None:
        self.store = dist.TCPStore(HOST, 0, is_master=True, wait_for_workers=False, timeout=_timeout(timeout))
        self.generation = 0
        self.members: list[int] = []
        self.store.set("gen", "0")

    @property
    def port(self) -> int:
        return int(self.store.port)

    def open(self, members: list[int]) -> int:
        """Open the next generation with these members (rank order); the members are written first,
        so a worker that reads the new number always finds them."""
        self.generation += 1
        self.members = list(members)
        self.store.set(f"members/{self.generation}", json.dumps(self.members))
        self.store.set("gen", str(self.generation))
        return self.generation

    def _read(self, key: str) -> str | None:
        return self.store.get(key).decode() if self.store.check([key]) else None

    def hello_pid(self, slot: int) -> int | None:
        return self.hello(slot)[0]

    def hello(self, slot: int) -> tuple[int | None, int | None]:
        """(PID, incarnation) of the newest hello of worker `slot`; (None, None) before any."""
        value = (self._read(f"hello/{slot}") or "").split()
        return (int(value[0]) if value else None), (int(value[1]) if len(value) > 1 else None)

    def failed_in(self, slot: int) -> int:
        value = self._read(f"failed/{slot}")
        return int(value) if value else 0

    def formed(self, generation: int) -> dict | None:
        value = self._read(f"formed/{generation}")
        return json.loads(value) if value else None

    def stopped(self) -> bool:
        return self.store.check(["stop"])


class Membership:
    """A worker's side: say it is ready, wait for a generation that names it, report failures."""

    def __init__(self, port: int, slot: int, timeout: float = 30.0, host: str = HOST) -> None:
        self.slot = slot
        self.store = dist.TCPStore(host, port, is_master=False, timeout=_timeout(timeout))

    def hello(self, pid: int, incarnation: int | None = None) -> None:
        """Ready to join; one key, so the launcher never pairs a PID with another start's incarnation."""
        self.store.set(f"hello/{self.slot}", str(pid) if incarnation is None else f"{pid} {incarnation}")

    def newest(self) -> int:
        return int(self.store.get("gen").decode())

    def stopped(self) -> bool:
        return self.store.check(["stop"])

    def stop(self) -> None:
        self.store.set("stop", "1")

    def report_failure(self, generation: int) -> None:
        self.store.set(f"failed/{self.slot}", str(generation))

    def mark_formed(self, generation: int, info: dict) -> None:
        self.store.set(f"formed/{generation}", json.dumps(info))

    def wait(
        self, after: int, timeout: float, interrupted: Callable[[], bool] = lambda: False
    ) -> tuple[int, list[int]]:
        """The first generation newer than `after` that names this worker; (0, []) once the run is
        over. A generation opened without this worker (it was not ready yet) is skipped."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and not interrupted():
            if self.stopped():
                return 0, []
            newest = self.newest()
            if newest > after:
                members = json.loads(self.store.get(f"members/{newest}").decode())
                if self.slot in members:
                    return newest, members
                after = newest
            time.sleep(POLL)
        raise TimeoutError(f"worker {self.slot} was named in no generation within {timeout:g} s")

    def form(self, generation: int, rank: int, world: int, backend: str, timeout: float) -> None:
        """Join generation `generation`'s process group (its own key prefix in the launcher's store)."""
        prefixed = dist.PrefixStore(f"pg/{generation}/", self.store)
        dist.init_process_group(backend, store=prefixed, rank=rank, world_size=world, timeout=_timeout(timeout))


def leave_group() -> None:
    """Leave the current process group, broken or not (a failed peer leaves gloo's pairs closed)."""
    if dist.is_available() and dist.is_initialized():
        with contextlib.suppress(RuntimeError):  # already torn down by the failure: nothing left to free
            dist.destroy_process_group()
