"""Rank 0's side of a `LearnerClient`'s step boundary: the events the links posted handed to the
learner core, and the contributions and declines it makes handed to the links.

Apart from `client` because this is the one part that talks to the links (only rank 0 holds them);
the client keeps the public calls and what every rank does.
"""

from __future__ import annotations

import logging
import queue
import time
from typing import TYPE_CHECKING, cast

from ..core import Contribution, Decline
from ..wire.headers import WorkStamp
from . import peerstate
from .ending import Ending, EndWatch
from .joining import resync
from .link import SynchronizerError

if TYPE_CHECKING:
    import torch

    from ..core import LearnerCore
    from ..wire.timeouts import Timeouts
    from .fanout import RankFanout
    from .link import LinkContext, ShardLink
    from .overlap import OverlapChooser

log = logging.getLogger("ddiloco.learner.client")  # the client's logger: these are its lines


class LeaderSide:
    """Mixed into `LearnerClient`, whose `__init__` and `start` make the core, links and state these use."""

    learner: int
    params: dict[str, torch.Tensor]
    optimizer: torch.optim.Optimizer | None
    timeouts: Timeouts
    ctx: LinkContext
    inbound: queue.Queue
    fanout: RankFanout | None
    links: list[ShardLink]
    owner: dict[int, int]
    names: list[list[str]]
    core: LearnerCore | None  # made by `start`, before any step boundary
    overlap: OverlapChooser | None  # made by `start` with the core
    donations: list[str]
    _donate_to: list[tuple[int, str]]
    _force: dict[int, int]
    _blocking: bool
    waits: int
    wait_seconds: float
    grant_waits: int
    grant_wait_seconds: float
    _span_start: list[float]
    _stop: bool
    _progress: float
    _fatal: str | None
    watch: EndWatch | None  # made by `start`: when this learner ends on its own (`ending`)
    ending: Ending | None
    steps: int
    tokens: int
    position: int
    counted_position: int
    rejected: list[str]

    def _leader_begin(self, tokens: int, seconds: float) -> tuple[list[int], list[int]]:
        """Count the step and apply what arrived; returns (applied, due) fragments."""
        if self._fatal:
            raise SynchronizerError(self._fatal)
        self._drain()
        self._check_end()
        core = cast("LearnerCore", self.core)  # made by `start`
        applied = core.begin_step(tokens, seconds)
        if self.overlap is not None:  # tau from the slowest link (`overlap`); fixed unless --overlap auto
            core.link_seconds = max((link.link_time.seconds() for link in self.links), default=0.0)
            core.overlap = self.overlap.update(core.step_time.get(), core.link_seconds)
        self._mark_spans(applied)
        self._stop = self.ctx.stop_requested.is_set()
        self._progress = max(self._progress, self.ctx.global_progress)
        return applied, core.due()

    def _leader_end(self, due: list[int]) -> list[int]:
        """Send the snapshots of `due`; with blocking syncs, wait for them. Returns fragments applied meanwhile."""
        core = cast("LearnerCore", self.core)  # made by `start`
        self._send(core.collect(), due)
        before = list(core.versions)
        waiting, started = core.must_wait(), time.perf_counter()  # counted: what synchronous methods cost
        while core.must_wait() and not self.ctx.stop_requested.is_set():
            self._drain(wait=self.timeouts.heartbeat)
            self._check_end()  # a blocking sync waits for no shard past the orphan bound
            core.apply_arrivals()
            self._send(core.collect(), [])
            if self._fatal:
                raise SynchronizerError(self._fatal)
        if waiting:
            self.waits += 1
            self.wait_seconds += time.perf_counter() - started
        self._await_grant()
        if self.fanout is None or self._blocking:  # else every rank must keep the value shared at the begin
            self._stop = self.ctx.stop_requested.is_set()
            self._progress = max(self._progress, self.ctx.global_progress)
        applied = [p for p in range(len(before)) if core.versions[p] != before[p]]
        self._mark_spans(applied)
        return applied

    def token_limit(self) -> int | None:
        """The fewest tokens any answering shard lets this learner train up to (`synchronizer.grants`);
        None: no limit (no token budget, or no shard has answered within the failure timeout)."""
        recent = time.monotonic() - self.timeouts.failure
        limits = [link.allowed for link in self.links if link.allowed is not None and link.contact >= recent]
        return min(limits) if limits else None

    def _await_grant(self) -> None:
        """Take no step past the token grant: a run with a token budget stops within a step per learner
        of it. Heartbeats are asked for at once; the wait ends with a larger grant or the run's stop.
        A blocking learner (`--overlap 0`, the synchronous methods) is not held: its rounds wait for
        every learner, and one held at its grant while another keeps a lead it cannot train (it
        waits for the held one's work) would stop both for good; it overshoots as before."""
        if self._blocking:
            return
        limit = self.token_limit()
        if limit is None or self.tokens < limit:
            return
        started = time.perf_counter()
        for link in self.links:
            link.beat_now()
        core = cast("LearnerCore", self.core)  # made by `start`
        while not self.ctx.stop_requested.is_set() and self.ending is None:
            self._drain(wait=self.timeouts.heartbeat / 10)
            self._check_end()
            if self.fanout is None:  # else the ranks take updates and requests together, at the begin
                core.apply_arrivals()  # as a blocking sync's wait does: updates land, requests are answered
                self._send(core.collect(), [])
            if self._fatal:
                raise SynchronizerError(self._fatal)
            limit = self.token_limit()
            if limit is None or self.tokens < limit:
                break
        self.grant_waits += 1
        self.grant_wait_seconds += time.perf_counter() - started

    def _check_end(self) -> None:
        """End on our own once the run is found finished or the orphan bound is passed (`ending`):
        `stopping` turns true, so the training loop (every rank's) leaves at this boundary."""
        if self.watch is None or self.ending is not None:
            return
        watch = self.watch
        ending = self._judge(watch)
        if ending is None and watch.idle(self.steps, max(link.contact for link in self.links)):
            log.warning(
                "learner %d: %d steps with no shard answering, S x H: more would be refused as stale; it waits "
                "for its synchronizer without training, at most %.0f s more (--orphan-timeout)",
                self.learner,
                self.steps - watch.heard_step,
                min(link.orphan_deadline() for link in self.links) - time.monotonic(),
            )
            while ending is None and watch.idle(self.steps, max(link.contact for link in self.links)):
                self._drain(wait=self.timeouts.heartbeat)  # bounded by the orphan timeout
                ending = self._judge(watch)
            if ending is None:
                log.info("learner %d: its synchronizer answers again; training on", self.learner)
        if ending is not None:
            self.ending = ending
            log.log(logging.ERROR if ending.code else logging.WARNING, "%s", ending.reason)
            self.ctx.stop_requested.set()

    def _judge(self, watch: EndWatch) -> Ending | None:
        """`watch.check` with the oldest and the newest of the shards' last answers."""
        oldest = min(self.links, key=lambda link: link.contact)
        newest = max(link.contact for link in self.links)
        return watch.check(self.steps, self.position, oldest.contact, oldest.address, newest=newest)

    def _cut_off(self) -> bool:
        """Some shard has not answered for longer than the failure timeout: waiting on it is in vain."""
        oldest = min((link.contact for link in self.links), default=time.monotonic())
        return self.watch is not None and self.watch.lost(oldest, time.monotonic())

    def _mark_spans(self, applied: list[int]) -> None:
        wall = time.time()
        for p in applied:
            self._span_start[p] = wall

    def _drain(self, wait: float | None = None) -> None:
        """Handle every inbound event; with `wait`, block up to that long for the first one."""
        first = True
        while True:
            try:
                event = self.inbound.get(timeout=wait) if (first and wait) else self.inbound.get_nowait()
            except queue.Empty:
                return
            first = False
            self._handle(event)

    def _handle(self, event: tuple) -> None:
        core = cast("LearnerCore", self.core)  # made by `start`, before the links post anything
        kind = event[0]
        if kind in ("update", "merged"):
            counted = event[-1].get(str(self.learner)) if isinstance(event[-1], dict) else None
            if isinstance(counted, int):
                self.counted_position = max(self.counted_position, counted)
        if kind == "update":
            _, _, update, force, _ = event
            p = update.fragment
            if force or self._force.get(p) == update.version:
                self._force.pop(p, None)
                core.force(update)
            else:
                core.receive(update)
        elif kind == "merged" and core.stopped:
            core.acknowledge(event[2], event[3])
        elif kind == "request":
            core.request(event[2])
        elif kind == "rejected":
            _, _, p, base, reason, action = event
            self.rejected.append(f"fragment {p}: {reason}")
            if action == "retry":
                core.retry(p, base)
        elif kind == "resync":
            resync(core, event[1], event[2], self._force, event[3])
        elif kind == "fatal":
            self._fatal = event[2]
        elif kind == "finished" and self.watch is not None:
            self.watch.finished[event[1]] = event[2]
        elif kind == "orphaned" and self.watch is not None:
            self.watch.gave_up[event[1]] = event[2]
        elif kind == "donate" and self.optimizer is not None and event[2] not in self.donations:
            self.donations.append(event[2])
            if self.fanout is not None and self.fanout.sharded:  # rank 0 holds only its own shards
                self._donate_to.append((event[1], event[2]))
            else:
                peerstate.start_upload(self.links[event[1]], event[2], *peerstate.snapshot(self.optimizer, self.params))

    def _send(self, messages: list, gathered: list[int]) -> None:
        """`gathered`: fragments whose sharded parameters were just pulled; only those may be snapshotted."""
        for m in messages:
            if (
                isinstance(m, Contribution)
                and self.fanout is not None
                and self.fanout.sharded
                and m.fragment not in gathered
            ):
                raise RuntimeError(f"fragment {m.fragment} was snapshotted without gathering its shards first")
            link = self.links[self.owner[m.fragment]]
            if isinstance(m, Contribution):
                link.push(
                    m,
                    WorkStamp(
                        position=self.position,
                        tokens_total=self.tokens,
                        final=cast("LearnerCore", self.core).stopped,
                        span_start=self._span_start[m.fragment],
                        snapshot_wall=time.time(),
                    ),
                )
            elif isinstance(m, Decline):
                link.decline(m)

    def _leave(self, timeout: float) -> list[int]:
        """Rank 0's part of `finish()`: send the work held and wait (bounded) for its merges. Returns the
        fragments whose value it wrote into the model meanwhile (every rank takes them)."""
        if self.ending is not None:  # nobody is left to merge what it holds: it stays on disk (`ending`)
            return []
        core = cast("LearnerCore", self.core)
        everything = list(range(len(self.names)))
        deadline = time.monotonic() + timeout
        self._drain()
        applied = set(core.apply_arrivals())
        self._send(core.flush(), everything)
        while any(v is not None for v in core.pending) and time.monotonic() < deadline and not self._fatal:
            if self._cut_off():  # a SIGTERM while cut off: leave within the grace, with the summary
                break
            self._drain(wait=0.1)
            applied.update(core.apply_arrivals())
            self._send(core.collect() + core.flush(), everything)
        applied.update(core.apply_arrivals())
        # a push still on its way (behind a long link a value can come back before our own push
        # lands): leaving now would have it refused for want of a session
        while any(link.pending_pushes() for link in self.links) and time.monotonic() < deadline and not self._cut_off():
            time.sleep(0.02)
        unmerged = sum(1 for v in core.pending if v is not None)
        if unmerged:
            log.warning("learner %d leaves with %d contributions not yet merged", self.learner, unmerged)
        return sorted(applied)
