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

The store listens on 127.0.0.1 only for a local run; on Slurm, on the one address `--sync-host` gives
(`dataparallel/slurm.py`), never on every interface. Given the run's secret, every value is signed
and a forged one is taken as absent (`storeauth`). Every wait is bounded.
"""

from __future__ import annotations

import contextlib
import datetime
import json
import logging
import time
from collections.abc import Callable

import torch.distributed as dist

from .storeauth import ForgedValue, SignedStore, master_store

log = logging.getLogger(__name__)

HOST = "127.0.0.1"
POLL = 0.05
_WARNED: set[str] = set()  # keys whose forged value was logged (only keys this module reads)


def _timeout(seconds: float) -> datetime.timedelta:
    return datetime.timedelta(seconds=seconds)


def _read(store: dist.Store, key: str) -> str | None:
    """The value of `key`; None when it is absent or forged (not signed with the run's secret)."""
    if not store.check([key]):
        return None
    try:
        return store.get(key).decode()
    except ForgedValue as exc:
        if key not in _WARNED:  # polled every tick: one line per key, not a flood a stranger controls
            _WARNED.add(key)
            log.warning("%s: ignored", exc)
        return None


class Coordinator:
    """The launcher's side: it hosts the store and opens generations."""

    def __init__(self, timeout: float = 30.0, host: str = HOST, secret: bytes | None = None) -> None:
        self.raw, self._socket = master_store(host, _timeout(timeout))  # bound to `host` alone
        self.store: dist.Store = self.raw if secret is None else SignedStore(self.raw, secret)
        self.generation = 0
        self.members: list[int] = []
        self.store.set("gen", "0")

    @property
    def port(self) -> int:
        return int(self.raw.port)

    def open(self, members: list[int]) -> int:
        """Open the next generation with these members (rank order); the members are written first,
        so a worker that reads the new number always finds them."""
        self.generation += 1
        self.members = list(members)
        self.store.set(f"members/{self.generation}", json.dumps(self.members))
        self.store.set("gen", str(self.generation))
        return self.generation

    def _read(self, key: str) -> str | None:
        return _read(self.store, key)

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
        return self._read("stop") is not None


class Membership:
    """A worker's side: say it is ready, wait for a generation that names it, report failures."""

    def __init__(
        self, port: int, slot: int, timeout: float = 30.0, host: str = HOST, secret: bytes | None = None
    ) -> None:
        self.slot, self.secret = slot, secret
        self.raw = dist.TCPStore(host, port, is_master=False, timeout=_timeout(timeout))
        self.store: dist.Store = self.raw if secret is None else SignedStore(self.raw, secret)

    def hello(self, pid: int, incarnation: int | None = None) -> None:
        """Ready to join; one key, so the launcher never pairs a PID with another start's incarnation."""
        self.store.set(f"hello/{self.slot}", str(pid) if incarnation is None else f"{pid} {incarnation}")

    def newest(self) -> int:
        """The newest generation; 0 while the launcher's value is absent or forged."""
        return int(_read(self.store, "gen") or 0)

    def stopped(self) -> bool:
        return _read(self.store, "stop") is not None

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
                members = json.loads(_read(self.store, f"members/{newest}") or "[]")
                if self.slot in members:
                    return newest, members
                after = newest
            time.sleep(POLL)
        raise TimeoutError(f"worker {self.slot} was named in no generation within {timeout:g} s")

    def form(self, generation: int, rank: int, world: int, backend: str, timeout: float) -> None:
        """Join generation `generation`'s process group (its own key prefix in the launcher's store;
        gloo's own values signed too, scoped to the generation, when the run has a secret)."""
        prefix = f"pg/{generation}/"
        prefixed: dist.Store = dist.PrefixStore(prefix, self.raw)
        if self.secret is not None:  # outermost: gloo calls a Python store only through its own methods
            prefixed = SignedStore(prefixed, self.secret, scope=prefix)
        # torch names an unnamed group by a per-process count of the groups it began to make, and keys
        # the group's store entries by that name. A join that failed (a peer killed before it arrived:
        # the wait timed out) made no group to destroy, so nothing reset the count: this process then
        # named every later generation one higher than a freshly started peer did, and no generation
        # formed again (each waited out its timeout for keys nobody wrote). Every generation has its
        # own prefix, so every member names its group the same, whatever its own failures.
        dist.distributed_c10d._world.group_count = 0
        dist.init_process_group(backend, store=prefixed, rank=rank, world_size=world, timeout=_timeout(timeout))


def leave_group() -> None:
    """Leave the current process group, broken or not (a failed peer leaves gloo's pairs closed)."""
    if dist.is_available() and dist.is_initialized():
        with contextlib.suppress(RuntimeError):  # already torn down by the failure: nothing left to free
            dist.destroy_process_group()
