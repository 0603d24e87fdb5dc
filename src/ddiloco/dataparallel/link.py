"""The data-parallel all-reduce on the emulated link: a DDP communication hook that all-reduces each
gradient bucket over the process group and passes the bucket's real ring bytes through the learners'
emulated link (`learner.wan`: `--net-latency/--net-bandwidth/--net-jitter`).

Per bucket, on the hook's future chain:

    wire      = the bucket / W, cast to the all-reduce's precision (bf16 by default, as
                `bf16_compress_hook`; fp32 possible), all-reduced for real (gloo or NCCL)
    the link  = the ring all-reduce's 2 (W - 1) hops (reduce-scatter, then all-gather); each hop
                sends one chunk of wire / W and receives one, both at once (the two token buckets
                of `WanLink`, one per direction, in small pieces), then waits one way's latency
                (+ jitter)
    the end   = the reduced wire copied back into the fp32 bucket: DDP sees the bucket done

So each worker sends (and receives) 2 (W - 1) / W x the bucket's wire bytes, paced at the link's
rate, and a bucket's all-reduce lasts at least 2 (W - 1) latencies. Buckets cross the link one after
the other, in the order DDP hands them over (one thread, as one ring's connections carry them).
DDP starts a bucket's all-reduce as soon as backward has produced its gradients and waits for all
of them at the end of backward: what of the link hides behind backward is what DDP really overlaps.
"""

# no `from __future__ import annotations`: DDP checks the hook's annotations as objects (GradBucket, Future)
import logging
import queue
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

from ..learner.wan import LinkConfig, WanLink

log = logging.getLogger(__name__)

DTYPES = {"bf16": torch.bfloat16, "fp32": torch.float32}  # `config.PRECISIONS`: --allreduce-precision


def ring_bytes(wire_bytes: float, world: int) -> float:
    """Bytes each worker sends (and receives) in a ring all-reduce of `wire_bytes` over `world`."""
    return 2.0 * (world - 1) / world * wire_bytes if world > 1 else 0.0


@dataclass
class _Reduced:
    """A bucket whose all-reduce went through, on its way over the link."""

    wire: torch.Tensor
    buffer: torch.Tensor
    world: int
    done: torch.futures.Future


class AllReduceLink:
    """The comm hook of one worker (`register`), its emulated link, and the books of what crossed it:
    `bytes_sent`/`bytes_received` (ring bytes, every all-reduce) and `busy_seconds` (the link's time
    on them: pacing and latency, not all of it waited for)."""

    def __init__(
        self,
        settings: LinkConfig,
        precision: str = "bf16",
        seed: int = 0,
        clock: Callable[[], float] = time.perf_counter,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        if precision not in DTYPES:
            raise ValueError(f"--allreduce-precision is one of {', '.join(DTYPES)}, got {precision!r}")
        self.settings, self.dtype = settings, DTYPES[precision]
        self.wan = WanLink(settings, seed=seed, clock=clock, sleep=sleep)
        # a hop's bytes go out and come in at once (full duplex): in pieces that each direction's bucket
        # holds many times over, so that pacing one direction never holds up the other
        self.piece = settings.bytes_per_second * WanLink.BURST_SECONDS / 4 or float("inf")
        self._clock = clock
        self.bytes_sent = self.bytes_received = 0.0
        self.busy_seconds = 0.0
        self.buckets = 0
        self.last_hook_at = 0.0  # (clock) when DDP last handed a bucket over: backward's gradients were ready
        self._queue: queue.Queue[_Reduced] = queue.Queue()
        self._closing = threading.Event()
        if settings.active:  # the link's one thread: buckets cross it in turn
            threading.Thread(target=self._run, name="ddiloco-allreduce-link", daemon=True).start()

    def register(self, model: torch.nn.parallel.DistributedDataParallel) -> None:
        """Every bucket of `model`'s backward goes through this link."""
        model.register_comm_hook(None, self.hook)

    def hook(self, state: Any, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
        """DDP's comm hook: all-reduce the bucket in the link's precision, then pass it over the link."""
        self.last_hook_at = self._clock()
        buffer = bucket.buffer()
        world = dist.get_world_size()
        wire = buffer.to(self.dtype).div_(world)  # a copy in bf16; fp32: the bucket itself, as DDP's own hook
        devices: list[int | str | torch.device] | None = [buffer.device] if buffer.device.type == "cuda" else None
        done: torch.futures.Future[torch.Tensor] = torch.futures.Future(devices=devices)
        reduced = _Reduced(wire, buffer, world, done)
        work = dist.all_reduce(wire, async_op=True)
        assert work is not None
        work.get_future().add_done_callback(lambda fut: self._after_reduce(fut, reduced))
        return done

    def _after_reduce(self, fut: torch.futures.Future, r: _Reduced) -> None:
        try:
            fut.wait()
        except Exception as exc:  # a peer failed: DDP's backward raises it, the worker regroups
            r.done.set_exception(exc)
            return
        if not self.settings.active:
            self._finish(r, 0.0)
            return
        self._queue.put(r)

    def close(self) -> None:
        """Stop the link's thread (a bucket still on its way is dropped: its step is not committed)."""
        self._closing.set()

    def _run(self) -> None:
        while not self._closing.is_set():
            try:
                r = self._queue.get(timeout=0.5)
            except queue.Empty:
                continue
            try:
                t0 = self._clock()
                self.cross(r.wire.numel() * r.wire.element_size(), r.world)
                self._finish(r, self._clock() - t0)
            except Exception as exc:  # never leave DDP waiting on a bucket
                log.exception("the all-reduce link failed")
                r.done.set_exception(exc)

    def cross(self, wire_bytes: int, world: int) -> None:
        """The ring's hops on the link: one chunk each way per hop, then a one-way latency."""
        chunk = wire_bytes / world
        for _ in range(2 * (world - 1)):
            left = chunk
            while left > 0:
                piece = min(left, self.piece)
                self.wan.sent(piece)
                self.wan.received(piece)
                left -= piece
            self.wan.delay()

    def _finish(self, r: _Reduced, busy: float) -> None:
        nbytes = ring_bytes(r.wire.numel() * r.wire.element_size(), r.world)
        self.bytes_sent += nbytes
        self.bytes_received += nbytes
        self.busy_seconds += busy
        self.buckets += 1
        if r.wire.data_ptr() != r.buffer.data_ptr():
            r.buffer.copy_(r.wire)  # bf16 back into the fp32 bucket
        r.done.set_result(r.buffer)
