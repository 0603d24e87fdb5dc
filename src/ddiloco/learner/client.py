"""The learner client: Decoupled DiLoCo for any PyTorch training loop in a few lines.

    client = LearnerClient(model, "127.0.0.1:7070", learner_id=0)
    position = client.start()             # registers, loads the global parameters
    stream.seek(position)                 # resume where this learner's counted work left off
    for batch in stream:
        loss = ...; loss.backward(); optimizer.step(); optimizer.zero_grad()
        client.step(tokens=batch.tokens)  # never waits on the network (unless --overlap 0, or at the budget)
        if client.stopping: break
    client.finish()                       # sends the work it still holds, leaves

All communication runs in background threads (`link`); `step` only moves already-received updates
into the model at the step boundary and hands snapshots to those threads. The algorithm is the
shared `LearnerCore`: this class is its driver for real time and a real network, like the simulator's
cluster is its driver for virtual time. On rank 0 it owns a `leader.Leader`, which drives the core
from the events the links post (and recovers from them) and hands the core's messages to the links.

In a torch.distributed job, create the client on every rank with the same arguments: rank 0 talks to
the synchronizer and broadcasts what changed (see `fanout`; FSDP2-sharded models too); `tokens` is the
per-rank count; `step` and `finish` are collective (every rank calls them at the same step).
"""

from __future__ import annotations

import json
import logging
import math
import queue
import secrets
import time
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, cast

import torch

from ..core import AlgorithmConfig, LearnerCore
from ..wire import framing
from ..wire.protocol import signature
from ..wire.timeouts import Timeouts
from . import addresses as addresses_
from . import peerstate, reporting
from .ending import DEFAULT_ORPHAN_TIMEOUT, Ending, EndWatch, RunFinished
from .fanout import RankFanout, active_group_size
from .joining import check_replies, make_core, register_fresh
from .journal import Journal
from .leader import Leader
from .link import LinkContext, ShardLink
from .overlap import OverlapChooser
from .wan import LinkConfig, WanLink

if TYPE_CHECKING:
    from .attach import Attachment

log = logging.getLogger(__name__)


class LearnerClient:
    def __init__(
        self,
        model: torch.nn.Module | Mapping[str, torch.Tensor],
        addresses: str | Sequence[str],
        learner_id: int,
        *,
        token: str | None = None,
        codec: str = "bf16",
        credentials=None,  # grpc.ChannelCredentials for TLS
        net_delay: float = 0.0,
        wan: LinkConfig | None = None,
        journal_dir: str | None = None,
        timeouts: Timeouts | None = None,
        process_group=None,
        start_timeout: float = 120.0,
        orphan_timeout: float = DEFAULT_ORPHAN_TIMEOUT,
        report_every: float = 30.0,
        optimizer: torch.optim.Optimizer | None = None,
        base_device: str = "cpu",
    ) -> None:
        """`report_every`: seconds between progress lines at INFO on the "ddiloco" logger
        (`ddiloco.log_to_stderr()` shows them). `optimizer`: the inner optimizer, for peer recovery:
        if it holds no state at `start()` (a new machine) it takes a live learner's, and it donates
        its own when another learner joins empty (`peerstate`). `wan`: an emulated link (`learner.wan`).
        `base_device`: where the fp32 copy of the global parameters lives (host: the model once on the GPU).
        `orphan_timeout`: seconds this learner trains on without an answer from a shard before it ends
        (`stopping` turns true, `ending` says why; at most S x H steps alone in any case: `ending`)."""
        from ..wire import quant

        quant.get(codec)  # validate early
        self.params = dict(model.named_parameters()) if isinstance(model, torch.nn.Module) else dict(model)
        self.addresses = [a.strip() for a in addresses.split(",")] if isinstance(addresses, str) else list(addresses)
        for address in self.addresses:
            addresses_.check_spec(address)
        if not self.addresses or not all(self.addresses):
            raise ValueError("give at least one synchronizer address host:port")
        self.learner = int(learner_id)
        self.incarnation = secrets.token_hex(6)
        self.codec = codec
        self.timeouts = timeouts or Timeouts()
        self.start_timeout = start_timeout
        if not 0 < orphan_timeout < float("inf"):
            raise ValueError(f"orphan_timeout must be a positive number of seconds, got {orphan_timeout}")
        self.report_every = float(report_every)
        self.optimizer = optimizer
        self.recovered: dict | None = None  # what peer recovery brought: donor, step, checksum
        self._recovered_state: peerstate.Recovered | None = None  # rank 0's, until every rank has it
        self._last_report = time.monotonic()
        self.fanout = RankFanout(self.params, process_group) if active_group_size(process_group) > 1 else None
        self.is_leader = self.fanout is None or self.fanout.is_leader
        self.world = self.fanout.world if self.fanout else 1
        self.inbound: queue.Queue = queue.Queue()
        self.ctx = LinkContext(
            learner=self.learner,
            incarnation=self.incarnation,
            signature=signature(self.params),
            token=token,
            codec=codec,
            inbound=self.inbound,
            progress=lambda: reporting.progress(self),
            credentials=credentials,
            net_delay=net_delay,
            wan=WanLink(wan),
            pin_memory=any(t.is_cuda for t in self.params.values()),
            orphan_timeout=float(orphan_timeout),
        )
        self.base_device = str(torch.device(base_device))
        self.links: list[ShardLink] = []
        self.core: LearnerCore | None = None
        self.names: list[list[str]] = []
        self.owner: dict[int, int] = {}
        self.config: AlgorithmConfig | None = None
        self.overlap: OverlapChooser | None = None  # tau, chosen from the link with --overlap auto (rank 0)
        self.journal = (
            Journal(f"{journal_dir}/journal-{self.incarnation}.json") if journal_dir and self.is_leader else None
        )
        self.leader: Leader | None = None  # rank 0's side of the step boundary, made by `start` with the core
        self._blocking = False
        self._stop, self._progress = False, 0.0
        self._ending: Ending | None = None  # see `ending`
        self._last_boundary = 0.0
        self.state = "new"
        self.started_wall = time.time()
        self.steps = self.tokens = 0
        self.compute_seconds = 0.0
        self.loss: float | None = None  # smoothed training loss, reported with heartbeats
        self.position = 0
        self.start_position = 0

    # --- start ----------------------------------------------------------------------------------
    def start(self) -> int:
        """Register with every shard, take the global parameters; returns the data position to resume at."""
        position, finished = 0, None
        try:
            position = self._start_leader() if self.is_leader else 0
        except RunFinished as exc:
            if self.fanout is None:
                raise
            finished = str(exc)  # every rank learns it, and leaves together
        if self.fanout is not None:
            shared = {
                "names": self.names,
                "blocking": self._blocking,
                "position": position,
                "recovered": self.recovered,
                "finished": finished,
            }
            shared = json.loads(self.fanout.share_bytes(json.dumps(shared).encode() if self.is_leader else None))
            if shared["finished"] is not None:
                raise RunFinished(shared["finished"], {"books": {}})
            self.recovered = shared["recovered"]
            self.names, self._blocking, position = shared["names"], bool(shared["blocking"]), int(shared["position"])
            self.fanout.push([n for names in self.names for n in names])
            if self.recovered is not None:  # rank 0 took a peer's inner state: every rank takes the same
                peerstate.share_state(self.fanout, self.optimizer, self.params, self._recovered_state)
                self._recovered_state = None
        self.position = self.start_position = position
        self.state = "training"
        self._last_boundary = time.perf_counter()
        return position

    def _start_leader(self) -> int:
        deadline = time.monotonic() + self.start_timeout
        addresses_.wait_resolved(self.addresses, deadline)  # address files may not be written yet
        self.links = [ShardLink(i, a, self.ctx, self.timeouts) for i, a in enumerate(self.addresses)]
        replies = register_fresh(self.links, self.ctx, self.params, self.fanout, deadline)
        plan, self.config, self.owner = check_replies(self.addresses, replies, self.params)
        for i, reply in enumerate(replies):
            if reply.get("finished") is True:  # a shard that is done and drained: nothing to train for
                raise RunFinished(f"synchronizer {self.links[i].address} has finished the run", {"books": {}})
        self.timeouts = self.links[0].timeouts
        where = str(self.journal.path.parent) if self.journal is not None else None
        solo = self.config.max_staleness * self.config.sync_every  # S rounds' worth of steps
        watch = EndWatch(self.learner, self.ctx.orphan_timeout, solo, self.timeouts.failure, where)
        self.names = [list(n) for n in plan.names]
        self._blocking = self.config.overlap == 0 or self.config.synchronous  # may wait at a boundary
        self.overlap = OverlapChooser(self.config.overlap, self.config.sync_every, self.config.overlap_auto)
        held = self.fanout.algorithm_params() if self.fanout is not None else self.params
        sharded = bool(self.fanout and self.fanout.sharded)
        self.core = make_core(self.learner, held, plan, self.config, sharded, self.base_device)
        self.leader = Leader(
            self.core,
            self.links,
            self.owner,
            self.ctx,
            self.timeouts,
            watch,
            self.overlap,
            self,
            optimizer=self.optimizer,
            params=self.params,
            sharded=sharded,
            apply_at_end=self.fanout is None or self._blocking,
            blocking=self._blocking,
        )
        self.leader.join(deadline)
        if self.optimizer is not None and not self.optimizer.state:
            got = peerstate.recover(self.links[0], self.params, self.learner)
            if got is not None:
                self.recovered = got.info()
                if self.fanout is None:
                    peerstate.load(self.optimizer, self.params, got.tensors, got.scalars)
                else:  # every rank loads it in start(): its shard (FSDP2) or the whole state (DDP)
                    self._recovered_state = got
        self._progress = max(float(r.get("progress", 0.0)) for r in replies)
        if any(r.get("stopping") for r in replies):
            self.ctx.stop_requested.set()
        position = max(int(r["resume_position"]) for r in replies)
        log.info(
            "learner %d joined at versions %s, resuming at data position %d", self.learner, self.core.versions, position
        )
        return position

    # --- the step boundary ----------------------------------------------------------------------
    def step(
        self, tokens: int, seconds: float | None = None, position: int | None = None, loss: float | None = None
    ) -> list[int]:
        """Call after each optimizer step. `tokens`: tokens in this rank's batch; `seconds`: the step's
        compute time (default: time since the previous boundary); `position`: the data stream position
        after this batch (default: one more than before); `loss`: the step's training loss, if you want
        it in the synchronizer's status, the run's metrics and the dashboard. Returns the fragments
        whose global value was just written into the model (`fragment_names(p)` lists their tensors).
        With a token budget it holds at this learner's token grant near the run's end
        (`Leader.token_limit`), so that the run stops within a step per learner of its budget."""
        now = time.perf_counter()
        if loss is not None and math.isfinite(loss):
            self.loss = loss if self.loss is None else 0.9 * self.loss + 0.1 * float(loss)
        seconds = now - self._last_boundary if seconds is None else float(seconds)
        tokens_here = int(tokens) * self.world
        self.steps += 1
        self.tokens += tokens_here
        self.compute_seconds += seconds
        self.position = self.position + 1 if position is None else int(position)
        applied, due, gathered = self._begin(tokens_here, seconds) if self.is_leader else ([], [], [])
        if self.fanout is not None:
            applied, due, self._stop, self._progress, donate = self.fanout.share_step(
                applied, due, self._stop, self._progress, len(self.names), bool(gathered)
            )
            self.fanout.push(self._names_of(applied))
            self.fanout.pull(self._names_of(due))
            if donate:  # collective: every rank gathers its shards of the inner state, rank 0 uploads
                peerstate.donate_gathered(
                    cast(torch.optim.Optimizer, self.optimizer),  # rank 0 has one, so every rank has (same arguments)
                    self.params,
                    self.links,
                    gathered,
                )
        waited = self._end(due) if self.is_leader else []
        if self.fanout is not None and self._blocking:
            waited, _, self._stop, self._progress, _ = self.fanout.share_step(
                waited, [], self._stop, self._progress, len(self.names)
            )
            self.fanout.push(self._names_of(waited))
        if self.journal is not None:
            reporting.write_journal(self, self.journal)
        if self.is_leader and time.monotonic() - self._last_report >= self.report_every:
            self._last_report = time.monotonic()
            reporting.log_line(self)
        self._last_boundary = time.perf_counter()
        return sorted(set(applied) | set(waited))

    def _begin(self, tokens: int, seconds: float) -> tuple[list[int], list[int], list[tuple[int, str]]]:
        """Rank 0's start of the boundary: (applied, due) fragments, and the donations to gather (link, ticket)."""
        leader = cast(Leader, self.leader)  # made by `start`, before any step boundary
        applied, due = leader.begin(tokens, seconds)
        self._stop, self._progress = leader.heard(self._progress)
        return applied, due, leader.take_gathered()

    def _end(self, due: list[int]) -> list[int]:
        """Rank 0: the leader sends the snapshots of `due` (waits, with blocking syncs): fragments applied."""
        leader = cast(Leader, self.leader)
        waited = leader.end(due)
        if self.fanout is None or self._blocking:  # else every rank must keep the value shared at the begin
            self._stop, self._progress = leader.heard(self._progress)
        return waited

    def attach(
        self,
        optimizer: torch.optim.Optimizer,
        *,
        tokens_per_step: int | None = None,
        count_tokens: Callable[[], int] | None = None,
        loss: Callable[[], float | None] | None = None,
    ) -> Attachment:
        """Call `step` after every `optimizer.step()` (a step post-hook), for loops you do not write.
        `tokens_per_step`: this rank's tokens per optimizer step, or `count_tokens()` returns them at
        each step; `loss()`, if given, the step's loss. Steps AMP's grad scaler skipped are not counted.
        Collective like `step` under torchrun: attach on every rank. Returns a handle: `.detach()`."""
        from .attach import Attachment

        return Attachment(self, optimizer, tokens_per_step, count_tokens, loss)

    def _names_of(self, fragments: Sequence[int]) -> list[str]:
        return [n for p in fragments for n in self.names[p]]

    def fragment_names(self, fragment: int) -> list[str]:
        """The parameter names of one fragment (after `start()`)."""
        return list(self.names[fragment])

    def stop(self, reason: str = "stopped by a learner") -> None:
        """End the whole run, as `ddiloco stop` does: every shard tells its learners to send what they
        hold and leave (`stopping` turns true). To leave alone, use `finish()`."""
        for link in self.links:
            link.control.call("Stop", framing.message({"reason": reason[:200]}), self.timeouts.rpc)

    # --- state ----------------------------------------------------------------------------------
    @property
    def stopping(self) -> bool:
        """The synchronizer asked the run to stop (token budget or duration reached), or this learner
        must end on its own: the run is over, or it has been cut off past the orphan bound (`ending`
        says why; `finish()` then returns at once)."""
        return self._stop

    @property
    def progress(self) -> float:
        """The run's progress in [0, 1] as the synchronizer sees it (for learning-rate schedules)."""
        return self._progress

    @property
    def ending(self) -> Ending | None:
        """Why this learner stopped on its own (`ending`), if it did: rank 0's leader finds it, `finish` shares it."""
        return self.leader.ending if self._ending is None and self.leader is not None else self._ending

    @ending.setter
    def ending(self, ending: Ending | None) -> None:
        self._ending = ending

    @property
    def donations(self) -> list[str]:
        """Tickets this learner donated its inner optimizer state for (peer recovery; rank 0's)."""
        return self.leader.tally.donations if self.leader is not None else []

    def stats(self) -> dict:
        return reporting.stats(self)

    # --- the end --------------------------------------------------------------------------------
    def finish(self, timeout: float | None = None) -> dict:
        """Send the work still held, wait (bounded) for it to be merged, leave. Returns stats().
        Collective in a learner of several ranks (every rank calls it): values that rank 0 takes while
        it waits reach every rank, so the ranks end with the same model. Merges of this final work
        come down as notices without values: the final global model is the synchronizer's
        (`fetch_global`)."""
        started = self.state == "training"
        self.state = "finishing"
        everything = list(range(len(self.names)))
        if started and self.fanout is not None and self.fanout.sharded:
            self.fanout.pull(self._names_of(everything))
        applied: list[int] = []
        if self.leader is not None:
            applied = self.leader.leave(self.timeouts.drain if timeout is None else timeout)
            self.close()
        if started and self.fanout is not None:
            applied = self.fanout.share_step(applied, [], self._stop, self._progress, len(self.names))[0]
            self.fanout.push(self._names_of(applied))
            ending = self.ending.as_dict() if self.ending is not None else None  # every rank ends alike
            shared = json.loads(self.fanout.share_bytes(json.dumps(ending).encode() if self.is_leader else None))
            self.ending = Ending(shared["ended"], int(shared["exit_code"])) if shared else None
        if self.state == "finishing":  # a rank other than 0, or a leader that never started
            self.state = "done"
        return self.stats()

    def close(self) -> None:
        """Leave every shard and stop the background threads (no flush; see finish)."""
        if self.state == "closed":
            return
        self.ctx.closing.set()
        finished = self.state == "finishing"  # from finish(): its loop is over (else an error, or no flush)
        for link in self.links:
            link.leave(self.tokens, finished)
        for link in self.links:
            link.close()
        if self.journal is not None:
            self.state = "orphaned" if self.ending is not None and self.ending.code else "done"
            reporting.write_journal(self, self.journal)
            self.journal.close()
        self.state = "closed"

    def __enter__(self) -> LearnerClient:
        self.start()
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc_type is None:
            self.finish()
        else:
            self.close()
