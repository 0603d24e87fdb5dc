"""`ddiloco learner`'s training loop: one of our built-in tasks trained through a `LearnerClient`.

Also the reference for using the client in any loop: build the model and optimizer, `start()` the
client, seek the data stream to the position it returns, then call `client.step` after each
optimizer step until `client.stopping`. Under torchrun every rank runs this same loop (DDP over the
ranks of this one learner); rank r of learner m reads data shard m * world + r.
"""

from __future__ import annotations

import datetime
import hashlib
import logging
import os
import signal
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch

from ..records import logsetup
from ..train.device import autocast, process_group_backend, resolve_device
from ..train.inner import InnerConfig, inner_step, lr_at, make_inner_optimizer, set_lr
from ..train.streams import SHARD_LAYOUTS
from ..train.tasks import make_task
from ..wire.protocol import state_checksum
from .client import LearnerClient
from .ending import DEFAULT_ORPHAN_TIMEOUT, Ending, RunFinished, clear_mark, mark_ended, restarted_after
from .peerstate import snapshot
from .state import BackgroundSaver, load_optimizer
from .wan import LinkConfig

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class LearnerSettings:
    learner: int
    addresses: str
    learners: int = 1  # data shards: learner m trains on shard m of this many
    model: str = "gpt"
    model_size: str = "default"
    data: str | None = None
    seq_len: int = 128
    shard_layout: str = SHARD_LAYOUTS[0]  # how the text is dealt to the learners (`streams.TokenWindowStream`)
    seed: int = 0
    inner: InnerConfig = field(default_factory=InnerConfig)
    codec: str = "bf16"
    token: str | None = None
    credentials: object = None
    state_dir: str | None = None
    net_delay: float = 0.0
    wan: LinkConfig = field(default_factory=LinkConfig)  # an emulated wide-area link (`wan`)
    max_steps: int | None = None
    checkpoint_every: int = 24
    start_timeout: float = 120.0
    orphan_timeout: float = DEFAULT_ORPHAN_TIMEOUT  # train on alone at most this long (and S x H steps): `ending`
    min_step_seconds: float = 0.0  # pad every step to this long: emulates a dedicated accelerator
    device: str = "auto"  # auto: cuda:LOCAL_RANK when CUDA is present, else cpu
    precision: str = "fp32"  # or bf16 (autocast; weights and optimizer state stay fp32)
    term_grace: float = 20.0  # after SIGTERM (a preemption notice): send the work held and exit within this
    peer_recovery: bool = True  # an empty inner optimizer at start copies a live learner's
    inner_state_dir: str | None = None  # where the inner optimizer state is saved (default STATE_DIR/inner)


def params_digest(model: torch.nn.Module) -> str:
    h = hashlib.sha256()
    for name, p in model.named_parameters():
        h.update(name.encode())
        h.update(p.detach().to("cpu", torch.float32).contiguous().numpy().tobytes())
    return h.hexdigest()[:16]


def _init_distributed(device: torch.device) -> tuple[int, int]:
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world > 1 and not torch.distributed.is_initialized():
        torch.distributed.init_process_group(process_group_backend(device))
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        return torch.distributed.get_rank(), torch.distributed.get_world_size()
    return 0, 1


def _exit_now(learner: int, code: int) -> None:
    """The grace after a stop signal is over: leave now, whatever is still in flight (the synchronizer
    counts it as lost when this learner's heartbeats stop)."""
    log.error("learner %d: the grace after the stop signal is over; exiting with what was sent", learner)
    logsetup.exit_now(code)


def leave_process_group() -> bool:
    """Ranks that reached the end of a run leave their group together. A rank that exits while its
    peer's gloo connection is still open may die with SIGABRT at teardown ("terminate called without
    an active exception"), and torchrun then restarts a group for a run that is over. Whether there was
    a group to leave."""
    dist = torch.distributed
    if not (dist.is_available() and dist.is_initialized()):
        return False
    try:  # bounded on gloo: a rank that never comes (it failed) must not hold the others forever
        if dist.get_backend() == "gloo":
            dist.monitored_barrier(timeout=datetime.timedelta(seconds=60))
        else:
            dist.barrier()
    except RuntimeError as exc:
        log.warning("not every rank reached the end of the run: %s", str(exc)[:300])
    dist.destroy_process_group()
    return True


def train(settings: LearnerSettings) -> dict:
    """Train until the synchronizer says stop (or max_steps, or SIGTERM, or the learner ends on its own:
    `ending`); returns the client's stats, whose "exit_code" is the one to exit with."""
    device = resolve_device(settings.device)
    if device.type == "cuda":
        torch.cuda.set_device(device)
    rank, world = _init_distributed(device)
    state_dir = Path(settings.state_dir) if settings.state_dir else None
    ended = restarted_after(state_dir)
    if ended is not None:
        log.warning("learner %d: %s", settings.learner, ended.reason)
        return {"learner": settings.learner, "steps": 0, "tokens": 0, **ended.as_dict(), "rank": rank, "world": world}
    task = make_task(
        settings.model,
        settings.data,
        seq_len=settings.seq_len,
        model_size=settings.model_size,
        shard_layout=settings.shard_layout,
    )
    model = task.build_model(settings.seed).to(device)
    trained: torch.nn.Module  # what the steps run: the model, or its DistributedDataParallel wrapper
    if world > 1:
        trained = torch.nn.parallel.DistributedDataParallel(
            model, device_ids=[device.index] if device.type == "cuda" else None
        )
    else:
        trained = model
    node = f" (Slurm node {os.environ['SLURMD_NODENAME']})" if os.environ.get("SLURMD_NODENAME") else ""
    log.info("learner %d rank %d/%d on %s in %s%s", settings.learner, rank, world, device, settings.precision, node)
    optimizer = make_inner_optimizer(model, settings.inner)
    client = LearnerClient(
        model,
        settings.addresses,
        settings.learner,
        token=settings.token,
        codec=settings.codec,
        credentials=settings.credentials,
        net_delay=settings.net_delay,
        wan=settings.wan,
        journal_dir=str(state_dir) if state_dir else None,
        start_timeout=settings.start_timeout,
        orphan_timeout=settings.orphan_timeout,
        optimizer=optimizer if settings.peer_recovery else None,  # empty at start: a live peer's state
    )
    stop = {"signal": False, "at": 0.0}

    def on_signal(signum, frame):  # noqa: ANN001
        if stop["signal"]:
            raise KeyboardInterrupt
        stop["signal"], stop["at"] = True, time.monotonic()
        client.ctx.stop_requested.set()
        log.warning(
            "learner %d got signal %d: sending the work it holds, exiting within %.0f s",
            settings.learner,
            signum,
            settings.term_grace,
        )
        watchdog = threading.Timer(settings.term_grace, _exit_now, (settings.learner, 128 + signum))
        watchdog.daemon = True
        watchdog.start()

    previous = {s: signal.signal(s, on_signal) for s in (signal.SIGTERM, signal.SIGINT)}
    saver = None
    inner_dir = (
        Path(settings.inner_state_dir) if settings.inner_state_dir else state_dir / "inner" if state_dir else None
    )
    own_steps = (load_optimizer(inner_dir, optimizer) if inner_dir else None) or 0
    try:
        try:
            position = client.start()
        except RunFinished as exc:  # a learner (re)started after its run ended: nothing trained, nothing lost
            client.ending = Ending(f"learner {settings.learner}: {exc}; nothing to train", 0)
            return {**client.stats(), "rank": rank, "world": world, "params_sha": ""}
        except ConnectionError:
            if stop["signal"]:  # told to stop before it could join: nothing trained, nothing lost
                log.info("learner %d stopped before joining", settings.learner)
                return {**client.stats(), "rank": rank, "world": world, "params_sha": ""}
            raise
        inner_steps = own_steps or (client.recovered or {}).get("step", 0)
        if rank == 0 and state_dir is not None:
            clear_mark(state_dir)
        if rank == 0 and inner_dir is not None:
            saver = BackgroundSaver(inner_dir)
        stream = task.stream(
            settings.learner * world + rank, settings.learners * world, settings.inner.batch_size, settings.seed
        )
        stream.seek(position)
        log.info(
            "learner %d rank %d/%d starts at data position %d (inner step %d)",
            settings.learner,
            rank,
            world,
            position,
            inner_steps,
        )
        steps = 0
        since_adoption = 0  # steps since the model last took a global value (it just joined)
        while not client.stopping and (settings.max_steps is None or steps < settings.max_steps):
            started = time.perf_counter()
            batch = stream.next()
            set_lr(optimizer, lr_at(settings.inner, inner_steps, client.progress, since_adoption))
            with autocast(settings.precision, device):
                loss = task.loss(trained, batch)
            inner_step(trained, optimizer, loss, settings.inner.grad_clip)
            inner_steps += 1
            steps += 1
            pad = settings.min_step_seconds - (time.perf_counter() - started)
            if pad > 0:  # the "chip" is busy for the whole step: the pad counts as compute time
                time.sleep(pad)
            adopted = client.step(batch.tokens, position=stream.position, loss=float(loss.detach()))
            since_adoption = 0 if adopted else since_adoption + 1
            if saver is not None and inner_steps % settings.checkpoint_every == 0:
                saver.submit(optimizer, inner_steps)
        if saver is not None:
            saver.submit(optimizer, inner_steps)
        digest = params_digest(model)  # every rank holds the same values here (see `fanout`)
        left = settings.term_grace - (time.monotonic() - stop["at"]) - 1.0 if stop["signal"] else None
        inner = state_checksum(*snapshot(optimizer, dict(model.named_parameters())))[:16]
        stats = client.finish(timeout=None if left is None else max(0.0, left))
        if rank == 0 and state_dir is not None and client.ending is not None and client.ending.code:
            mark_ended(state_dir, client.ending)
        return {**stats, "rank": rank, "world": world, "params_sha": digest, "inner_sha": inner}
    finally:
        if saver is not None:
            saver.close()
        client.close()
        for s, handler in previous.items():
            signal.signal(s, handler)
