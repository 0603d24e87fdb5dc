"""One data-parallel worker process: join a generation, train with DDP until the budget or until the
launcher opens a newer generation, regroup after a failure.

The step is a ddiloco learner's step (`learner.trainer`): the same task, model, data shard (worker
m reads shard m of M, as learner m does), AdamW, gradient clipping and learning rate
(`train.inner.lr_at`: warm-up over steps, cosine decay over the run's token progress), padded to
`--min-step-seconds`. What differs is only that DDP averages the gradients of every worker in
`backward()`, so every rank applies the same update.

A step is merged when its commit, a small all-gather after the pad, goes through on every rank: only
then is the optimizer stepped and the lineage counted (`replicated.Lineage`). The all-gather also
carries each rank's tokens, seconds and loss, and rank 0's reading of the launcher's newest
generation, so all ranks leave for a new generation after the same step. A collective that fails (a
peer died) is reported to the launcher; the survivor then waits for the next generation, keeping its
state in memory.
"""

from __future__ import annotations

import datetime
import functools
import gc
import hashlib
import logging
import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from ..learner.journal import Journal
from ..learner.wan import LinkConfig
from ..records import logsetup
from ..records.rundir import MetricsLog
from ..train.device import process_group_backend, resolve_device, step_slowdown
from ..train.inner import InnerConfig, lr_at, make_inner_optimizer, set_lr
from ..train.streams import SHARD_LAYOUTS
from ..train.tasks import make_task
from . import checkpoint
from .link import AllReduceLink
from .rendezvous import Membership, leave_group
from .replicated import Lineage, broadcast_state
from .storeauth import read_secret

log = logging.getLogger(__name__)
_INNER = InnerConfig()
TEARDOWN_STUCK_EXIT = 75  # a failed generation's teardown never ended: the launcher restarts the worker


def bounded(seconds: float, what: str, work: Callable[[], None], exit_code: int = TEARDOWN_STUCK_EXIT) -> None:
    """Run `work`; if it has not returned after `seconds`, log and end the process with `exit_code`.
    Once, on a loaded machine, a survivor's teardown of its gloo group after its peer was killed never
    returned, and every later generation waited for it until the run's limit; a worker that exits
    instead is restarted by its launcher and rejoins (elastic data-parallel)."""
    timer = threading.Timer(seconds, _stuck, args=(what, seconds, exit_code))
    timer.daemon = True
    timer.start()
    try:
        work()
    finally:
        timer.cancel()


def _stuck(what: str, seconds: float, exit_code: int) -> None:
    log.error("%s did not end within %g s: exiting (code %d) to be restarted", what, seconds, exit_code)
    logsetup.exit_now(exit_code)  # the line above reaches the log before the process ends


LOG_EVERY = 2.0  # seconds between rank 0's train/progress lines in metrics.jsonl


@dataclass(frozen=True)
class WorkerSettings:
    slot: int
    store_port: int
    run_dir: Path
    workers: int
    clock_origin: float = 0.0
    model: str = "gpt"
    model_size: str = "default"
    data: str | None = None
    seq_len: int = 128
    shard_layout: str = SHARD_LAYOUTS[0]
    batch_size: int = _INNER.batch_size  # the inner settings' defaults are InnerConfig's (`inner`)
    inner_lr: float | None = None  # None: the optimizer's default (train.inner.DEFAULT_LR)
    inner_optimizer: str = _INNER.optimizer
    slow_momentum: float = _INNER.slow_momentum
    slow_weight: float = _INNER.slow_weight
    seed: int = 0
    tokens: int | None = None
    duration: float | None = None
    checkpoint_every: int = 24
    min_step_seconds: float = 0.0
    device: str = "auto"
    collective_timeout: float = 30.0
    join_timeout: float = 300.0
    net_latency: float = 0.0  # ms (`link`: the all-reduce's emulated link)
    net_bandwidth: float = 0.0  # MB/s
    net_jitter: float = 0.0  # ms
    allreduce_precision: str = "bf16"  # what the all-reduce sends and sums in (`link.PRECISIONS`)
    store_host: str = "127.0.0.1"  # where the launcher's store listens (on Slurm: --sync-host)
    incarnation: int | None = None  # on Slurm: the job's restart count, so the launcher tells starts apart
    store_secret_file: Path | None = None  # the store's values are signed with the secret in it (`storeauth`)

    @property
    def inner(self) -> InnerConfig:
        """This worker's inner optimizer and schedule, as a learner's would be (`train.inner`)."""
        return InnerConfig(
            lr=self.inner_lr,  # type: ignore[arg-type]  # None: resolved by InnerConfig
            batch_size=self.batch_size,
            optimizer=self.inner_optimizer,  # type: ignore[arg-type]  # checked by InnerConfig
            slow_momentum=self.slow_momentum,
            slow_weight=self.slow_weight,
        )


class Worker:
    def __init__(self, s: WorkerSettings) -> None:
        self.s = s
        self.device = resolve_device(s.device)
        if self.device.type == "cuda":
            torch.cuda.set_device(self.device)
        self.task = make_task(s.model, s.data, seq_len=s.seq_len, model_size=s.model_size, shard_layout=s.shard_layout)
        self.inner = s.inner
        self.model = self.task.build_model(s.seed).to(self.device)
        self.optimizer = make_inner_optimizer(self.model, self.inner)
        self.ckpt_dir = s.run_dir / "checkpoint"
        self.lineage = Lineage(s.workers)  # rank 0 reads the checkpoint when it forms a generation
        self.stream = self.task.stream(s.slot, s.workers, s.batch_size, s.seed)
        link = LinkConfig(s.net_latency, s.net_bandwidth, s.net_jitter)
        self.link = AllReduceLink(link, s.allreduce_precision, seed=s.seed * 1000 + s.slot)
        self.pad_to = s.min_step_seconds * step_slowdown(s.slot)  # this worker's emulated accelerator
        secret = read_secret(s.store_secret_file) if s.store_secret_file is not None else None
        self.membership = Membership(
            s.store_port, s.slot, timeout=s.collective_timeout, host=s.store_host, secret=secret
        )
        self.journal = Journal(s.run_dir / f"learner-{s.slot}" / f"journal-{os.getpid()}-{time.time_ns()}.json")
        # this process's journal: what it computed (tokens, seconds, steps), how much of it was merged
        self.books: dict[str, Any] = {"slot": s.slot, "pid": os.getpid(), "tokens": 0, "seconds": 0.0, "steps": 0}
        self.books.update(merged_steps=0, failed_steps=0, generation=0, start_step=None)
        # the all-reduce (`link`): seconds backward waited for it after its last gradient, the link's busy
        # seconds (pacing and latency, partly hidden behind backward), the ring bytes each way
        self.books.update(link_seconds=0.0, link_busy_seconds=0.0, allreduce_bytes_sent=0.0)
        self.generation, self.rank, self.carried = 0, 0, False  # carried: state from a formed generation
        self.writer: checkpoint.Writer | None = None
        self.metrics: MetricsLog | None = None
        self._log = {"at": time.monotonic(), "loss": 0.0, "n": 0}

    # --- generations ----------------------------------------------------------------------------
    def run(self) -> int:
        """Train until the run is over; 0 on a finished run."""
        self.journal.write(self.books)
        # Read before saying hello: every generation that names this process is opened after its
        # hello, so an older one (that of the job it replaces) is never joined.
        self.generation = self.membership.newest()
        self.membership.hello(os.getpid(), self.s.incarnation)
        while True:
            generation, members = self.membership.wait(self.generation, self.s.join_timeout)
            if generation == 0:
                log.info("worker %d: the run is over", self.s.slot)
                return 0
            self.generation = self.books["generation"] = generation
            try:
                model = self._form(generation, members)
                over = self._train(model, members)
            except RuntimeError as exc:  # gloo/NCCL: a peer died or hung past the collective timeout
                log.warning("worker %d: generation %d failed: %s", self.s.slot, generation, str(exc)[:300])
                model = None
                bounded(
                    2 * self.s.collective_timeout,
                    f"worker {self.s.slot}: leaving failed generation {generation}",
                    functools.partial(self._leave_failed, generation),
                )
                continue
            if over:
                self._finish()
                return 0
            model = None
            leave_group()
            gc.collect()

    def _leave_failed(self, generation: int) -> None:
        self.optimizer.zero_grad(set_to_none=True)
        self.membership.report_failure(generation)
        leave_group()
        gc.collect()  # the old DDP wrapper's hooks go with it before the next one is made

    def _form(self, generation: int, members: list[int]) -> torch.nn.Module:
        """Join the generation's group; rank 0's state becomes everyone's."""
        rank, world = members.index(self.s.slot), len(members)
        if rank == 0 and not self.carried:  # nothing in memory newer than the checkpoint: take the newest
            restored = checkpoint.restore(self.ckpt_dir, self.model, self.optimizer, self.s.workers)
            self.lineage = restored or self.lineage
        if rank == 0 and not self.lineage.window_start:
            self.lineage.window_start = time.time()
        self.membership.form(generation, rank, world, process_group_backend(self.device), self.s.collective_timeout)
        broadcast_state(self.optimizer, self.lineage, self.device)
        model = torch.nn.parallel.DistributedDataParallel(
            self.model,
            device_ids=[self.device.index] if self.device.type == "cuda" else None,
            forward_sync_buffers=False,  # buffers do not change in training; init syncs all from rank 0
        )
        self.link.register(model)  # every gradient bucket: all-reduced in its precision, over the link
        self.rank, self.carried = rank, True
        if self.books["start_step"] is None:  # where this process's training began: a checkpoint, or a peer
            self.books["start_step"] = self.lineage.step
        log.info(
            "worker %d: rank %d of %d in generation %d at step %d",
            self.s.slot,
            rank,
            world,
            generation,
            self.lineage.step,
        )
        if rank == 0:
            self.writer = self.writer or checkpoint.Writer(self.ckpt_dir)
            self.metrics = self.metrics or MetricsLog(self.s.run_dir / "metrics.jsonl")
            info = {"world": world, "members": members, "step": self.lineage.step, "wall": time.time()}
            self.membership.mark_formed(generation, {**info, "tokens_merged": self.lineage.tokens_merged})
        return model

    # --- steps ----------------------------------------------------------------------------------
    def _progress(self) -> float:
        """The run's progress in [0, 1] from the lineage alone, which every rank holds alike: the
        learning rate and the end are decided the same on every rank, never by its own clock."""
        parts = []
        if self.s.tokens is not None:
            parts.append(self.lineage.tokens_merged / self.s.tokens)
        if self.s.duration is not None and self.lineage.last_commit:
            parts.append((self.lineage.last_commit - self.lineage.window_start) / self.s.duration)
        return min(1.0, max(parts, default=0.0))

    def _train(self, model: torch.nn.Module, members: list[int]) -> bool:
        """Steps until the budget (True) or a newer generation (False); raises when a collective fails."""
        world = len(members)
        while True:
            if self._progress() >= 1.0:
                return True
            started, t0 = time.time(), time.perf_counter()
            self.stream.seek(self.lineage.positions[self.s.slot])  # the lineage's place, not a lost step's
            batch = self.stream.next()
            set_lr(self.optimizer, lr_at(self.inner, self.lineage.step, self._progress()))
            try:
                loss = self.task.loss(model, batch)
                loss.backward()  # DDP all-reduces the gradients here, bucket by bucket (`link`)
                # after its last gradient, backward waited for what of the all-reduce it did not overlap
                waited = max(0.0, time.perf_counter() - max(t0, self.link.last_hook_at))
            finally:  # the compute was spent whether its all-reduce went through or not
                self.books["tokens"] += batch.tokens
                self.books["steps"] += 1
                self.books["failed_steps"] += 1  # until the commit below says otherwise
                self.journal.write(self.books)
            if self.inner.grad_clip > 0:
                torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.inner.grad_clip)
            pad = self.pad_to - (time.perf_counter() - t0 - waited)
            if pad > 0:  # the emulated accelerator is busy for the step's compute
                time.sleep(pad)
            seconds = time.perf_counter() - t0 - waited  # compute: the useful seconds of the step
            self.books["seconds"] += seconds
            self.books["link_seconds"] += waited
            self.books["link_busy_seconds"] = self.link.busy_seconds
            self.books["allreduce_bytes_sent"] = self.link.bytes_sent
            self.journal.write(self.books)
            newest = self.membership.newest() if self.rank == 0 else 0
            mine = torch.tensor([batch.tokens, seconds, newest, float(loss.detach())], dtype=torch.float64)
            rows = [torch.zeros_like(mine, device=self.device) for _ in range(world)]
            dist.all_gather(rows, mine.to(self.device))  # the commit: every rank got here
            table = torch.stack(rows).cpu()
            self.optimizer.step()
            self.optimizer.zero_grad(set_to_none=True)
            self.lineage.commit(members, int(table[:, 0].sum()), float(table[:, 1].sum()), started, time.time())
            self.books["merged_steps"] += 1
            self.books["failed_steps"] -= 1
            self.journal.write(self.books)
            if self.rank == 0:
                self._rank0_after_step(float(table[:, 3].mean()))
            if int(table[:, 2].max()) > self.generation:
                return False

    def _rank0_after_step(self, loss: float) -> None:
        if self.lineage.step % self.s.checkpoint_every == 0 and self.writer is not None:
            self.writer.submit(checkpoint.snapshot(self.model, self.optimizer, self.lineage))
        self._log["loss"] += loss
        self._log["n"] += 1
        if time.monotonic() - self._log["at"] >= LOG_EVERY and self.metrics is not None:
            t, tokens = time.time() - self.s.clock_origin, self.lineage.tokens_merged
            self.metrics.write("train", t, tokens, train_loss=self._log["loss"] / self._log["n"])
            elapsed = max(1e-9, time.time() - self.lineage.window_start)
            goodput = self.lineage.useful_seconds / (self.s.workers * elapsed)
            self.metrics.write("progress", t, tokens, goodput=min(1.0, goodput), tokens_merged=tokens)
            self._log.update(at=time.monotonic(), loss=0.0, n=0)

    def _finish(self) -> None:
        """Rank 0 makes the final state durable, then says the run is over; all leave together. Each
        worker's journal keeps a digest of its final parameters: every rank's must be the same."""
        self.books["final_params_sha256"] = params_digest(self.model)
        self.journal.write(self.books)
        if self.rank == 0 and self.writer is not None:
            self.writer.submit(checkpoint.snapshot(self.model, self.optimizer, self.lineage, final=True))
            self.writer.close()
            self.membership.stop()
        if self.metrics is not None:
            self.metrics.close()
        try:  # bounded: a peer that never comes (it failed just now) must not hold this one forever
            if dist.get_backend() == "gloo":
                dist.monitored_barrier(timeout=datetime.timedelta(seconds=self.s.collective_timeout))
            else:
                dist.barrier()
        except RuntimeError as exc:
            log.warning("worker %d: not every rank reached the end: %s", self.s.slot, str(exc)[:200])
        leave_group()
        self.link.close()
        self.journal.close()


def params_digest(model: torch.nn.Module) -> str:
    """SHA-256 of the parameters' bytes (fp32, on the CPU, in `named_parameters` order)."""
    digest = hashlib.sha256()
    for _, p in model.named_parameters():
        digest.update(p.detach().to("cpu", torch.float32).contiguous().numpy().tobytes())
    return digest.hexdigest()
