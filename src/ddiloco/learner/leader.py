"""Rank 0's side of `LearnerClient`'s step boundary (`Leader`): the events the links posted handed to
the learner core, and the contributions and declines it makes handed to the links.

Only rank 0 holds the links, so only rank 0's client owns a `Leader` (made by `start` with the core);
the client keeps the public calls and what every rank does.

Recovery, in the training thread, from the events the links post:
* "resync" after (re)registering: fragments the synchronizer holds at an *older* version than we do
  (it restarted from an older checkpoint) are overwritten with its value when it arrives
  (`LearnerCore.force`); fragments at the same version with a contribution in flight are retried
  (`LearnerCore.retry`: the contribution may have died with the old connection).
* a rejected contribution: "retry" resends the work, "reset" overwrites the fragment with the global
  value sent along (the work is counted as lost), "none" waits for the update already on its way.
"""

from __future__ import annotations

import logging
import queue
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol

from ..core import Contribution, Decline
from ..wire.headers import WorkStamp
from . import peerstate
from .ending import Ending, EndWatch
from .joining import await_global, resync
from .link import SynchronizerError

if TYPE_CHECKING:
    import torch

    from ..core import LearnerCore
    from ..wire.timeouts import Timeouts
    from .link import LinkContext, ShardLink
    from .overlap import OverlapChooser

log = logging.getLogger("ddiloco.learner.client")  # the client's logger: these are its lines


class Counters(Protocol):
    """The client's counters, as the leader reads them where it sends work or checks for the end."""

    @property
    def steps(self) -> int: ...
    @property
    def tokens(self) -> int: ...  # every rank's, all steps
    @property
    def position(self) -> int: ...


@dataclass
class Tally:
    """What the leader counts at the step boundaries, for the client's stats and journal."""

    counted_position: int = 0  # the furthest data position of ours a synchronizer says it counted
    waits: int = 0  # boundaries where we waited for a merged fragment (blocking, streaming)
    wait_seconds: float = 0.0  # and how long
    grant_waits: int = 0  # boundaries held at the token grant (`Leader.token_limit`)
    grant_wait_seconds: float = 0.0  # and how long
    grants_outwaited: int = 0  # holds given up after a failure timeout without a larger grant
    rejected: list[str] = field(default_factory=list)  # why contributions were refused
    donations: list[str] = field(default_factory=list)  # tickets this learner donated its inner state for


class Leader:
    """Owned by rank 0's `LearnerClient`: drives its learner core from the links' events at each step
    boundary, hands what the core makes to the links and holds a boundary at the token grant. Its own
    state: fragments to overwrite (`resync`), each fragment's span, a fatal refusal, donations to
    gather, its `Tally` and `ending`."""

    def __init__(
        self,
        core: LearnerCore,
        links: Sequence[ShardLink],
        owner: Mapping[int, int],
        ctx: LinkContext,
        timeouts: Timeouts,
        watch: EndWatch,
        overlap: OverlapChooser,
        counters: Counters,
        *,
        optimizer: torch.optim.Optimizer | None,
        params: Mapping[str, torch.Tensor],
        sharded: bool,
        apply_at_end: bool,
        blocking: bool,
    ) -> None:
        """`owner`: fragment -> index of the link whose shard owns it; `optimizer` (with `params`): the
        inner optimizer whose state a joining peer may ask for; `sharded`: FSDP2, where rank 0 holds
        only its own shards (its snapshots and donations are gathered at a boundary first);
        `apply_at_end`: updates may land after the begin of a boundary too (one rank, or blocking syncs,
        whose end every rank shares), else only at the begin, where the ranks take them together;
        `blocking`: a boundary may wait for a merged fragment (`--overlap 0`, the synchronous methods)."""
        self.learner = ctx.learner
        self.inbound = ctx.inbound  # the events the links post
        self.core = core
        self.links = links
        self.owner = owner
        self.ctx = ctx
        self.timeouts = timeouts
        self.watch = watch  # when this learner ends on its own (`ending`)
        self.overlap = overlap  # tau from the slowest link; fixed unless --overlap auto
        self.counters = counters
        self.optimizer = optimizer
        self.params = params
        self.sharded = sharded
        self.apply_at_end = apply_at_end
        self.blocking = blocking
        self.tally = Tally()
        self.ending: Ending | None = None  # why this learner stopped on its own, once it has
        self._gathered: list[tuple[int, str]] = []  # (link, ticket): a sharded learner gathers at a boundary
        self._force: dict[int, int] = {}
        self._span_start: list[float] = []
        self._fatal: str | None = None

    def join(self, deadline: float) -> None:
        """Start the links, await every fragment's global value (by `deadline`) and take them (and the pull
        requests that came along): the first step boundary may come."""
        for link in self.links:
            link.start()
        updates, requests = await_global(self.inbound, len(self.core.versions), deadline)
        self.ctx.initial = None  # only the first registration's replies may say "you hold it"
        self.core.join(updates)
        for r in requests:
            self.core.request(r)
        self._span_start = [time.time()] * len(self.core.versions)

    def heard(self, progress: float) -> tuple[bool, float]:
        """Whether the links were told to stop, and the run's progress they last heard (at least `progress`)."""
        return self.ctx.stop_requested.is_set(), max(progress, self.ctx.global_progress)

    def take_gathered(self) -> list[tuple[int, str]]:
        """The donations (link, ticket) that every rank's shards must be gathered for at this boundary."""
        gathered, self._gathered = self._gathered, []
        return gathered

    def begin(self, tokens: int, seconds: float) -> tuple[list[int], list[int]]:
        """Count the step and apply what arrived; returns (applied, due) fragments."""
        if self._fatal:
            raise SynchronizerError(self._fatal)
        self._drain()
        self._check_end()
        core = self.core
        applied = core.begin_step(tokens, seconds)
        # tau from the slowest link (`overlap`); fixed unless --overlap auto
        core.link_seconds = max((link.link_time.seconds() for link in self.links), default=0.0)
        core.overlap = self.overlap.update(core.step_time.get(), core.link_seconds)
        self._mark_spans(applied)
        return applied, core.due()

    def end(self, due: list[int]) -> list[int]:
        """Send the snapshots of `due`; with blocking syncs, wait for them. Returns fragments applied meanwhile."""
        core = self.core
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
            self.tally.waits += 1
            self.tally.wait_seconds += time.perf_counter() - started
        self._await_grant()
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
        waits for the held one's work) would stop both for good; it overshoots as before. A grant
        binds only while it grows: held a failure timeout without a larger one (a shard that restarted
        or moved, a starved heartbeat), the learner trains on, as with a shard that does not answer."""
        if self.blocking:
            return
        limit = self.token_limit()
        if limit is None or self.counters.tokens < limit:
            return
        started = time.perf_counter()
        for link in self.links:
            link.beat_now()
        core = self.core
        held_until = time.monotonic() + self.timeouts.failure
        while not self.ctx.stop_requested.is_set() and self.ending is None:
            if time.monotonic() > held_until:
                self.tally.grants_outwaited += 1
                log.warning(
                    "learner %d: no larger token grant for %.1f s (failure timeout): training on past it",
                    self.learner,
                    self.timeouts.failure,
                )
                break
            self._drain(wait=self.timeouts.heartbeat / 10)
            self._check_end()
            if self.apply_at_end:  # else the ranks take updates and requests together, at the begin
                core.apply_arrivals()  # as a blocking sync's wait does: updates land, requests are answered
                self._send(core.collect(), [])
            if self._fatal:
                raise SynchronizerError(self._fatal)
            limit = self.token_limit()
            if limit is None or self.counters.tokens < limit:
                break
        self.tally.grant_waits += 1
        self.tally.grant_wait_seconds += time.perf_counter() - started

    def _check_end(self) -> None:
        """End on our own once the run is found finished or the orphan bound is passed (`ending`):
        `stopping` turns true, so the training loop (every rank's) leaves at this boundary."""
        if self.ending is not None:
            return
        watch, steps = self.watch, self.counters.steps
        ending = self._judge(watch)
        if ending is None and watch.idle(steps, max(link.contact for link in self.links)):
            log.warning(
                "learner %d: %d steps with no shard answering, S x H: more would be refused as stale; it waits "
                "for its synchronizer without training, at most %.0f s more (--orphan-timeout)",
                self.learner,
                steps - watch.heard_step,
                min(link.orphan_deadline() for link in self.links) - time.monotonic(),
            )
            while ending is None and watch.idle(steps, max(link.contact for link in self.links)):
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
        return watch.check(self.counters.steps, self.counters.position, oldest.contact, oldest.address, newest=newest)

    def _cut_off(self) -> bool:
        """Some shard has not answered for longer than the failure timeout: waiting on it is in vain."""
        oldest = min((link.contact for link in self.links), default=time.monotonic())
        return self.watch.lost(oldest, time.monotonic())

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
        core = self.core
        kind = event[0]
        if kind in ("update", "merged"):
            counted = event[-1].get(str(self.learner)) if isinstance(event[-1], dict) else None
            if isinstance(counted, int):
                self.tally.counted_position = max(self.tally.counted_position, counted)
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
            self.tally.rejected.append(f"fragment {p}: {reason}")
            if action == "retry":
                core.retry(p, base)
        elif kind == "resync":
            resync(core, event[1], event[2], self._force, event[3])
        elif kind == "fatal":
            self._fatal = event[2]
        elif kind == "finished":
            self.watch.finished[event[1]] = event[2]
        elif kind == "orphaned":
            self.watch.gave_up[event[1]] = event[2]
        elif kind == "donate" and self.optimizer is not None and event[2] not in self.tally.donations:
            self.tally.donations.append(event[2])
            if self.sharded:  # rank 0 holds only its own shards
                self._gathered.append((event[1], event[2]))
            else:
                peerstate.start_upload(self.links[event[1]], event[2], *peerstate.snapshot(self.optimizer, self.params))

    def _send(self, messages: list, gathered: list[int]) -> None:
        """`gathered`: fragments whose sharded parameters were just pulled; only those may be snapshotted."""
        for m in messages:
            if isinstance(m, Contribution) and self.sharded and m.fragment not in gathered:
                raise RuntimeError(f"fragment {m.fragment} was snapshotted without gathering its shards first")
            link = self.links[self.owner[m.fragment]]
            if isinstance(m, Contribution):
                link.push(
                    m,
                    WorkStamp(
                        position=self.counters.position,
                        tokens_total=self.counters.tokens,
                        final=self.core.stopped,
                        span_start=self._span_start[m.fragment],
                        snapshot_wall=time.time(),
                    ),
                )
            elif isinstance(m, Decline):
                link.decline(m)

    def leave(self, timeout: float) -> list[int]:
        """Rank 0's part of `finish()`: send the work held and wait (bounded) for its merges. Returns the
        fragments whose value it wrote into the model meanwhile (every rank takes them)."""
        if self.ending is not None:  # nobody is left to merge what it holds: it stays on disk (`ending`)
            return []
        core = self.core
        everything = list(range(len(core.versions)))
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
