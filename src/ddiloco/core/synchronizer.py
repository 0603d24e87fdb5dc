"""The synchronizer's side of Decoupled DiLoCo (Algorithm 2) as an event-in, action-out state machine.

Per fragment it runs rounds: the first contribution for the current version opens a round and pulls
the fragment from every other live learner; once the quorum (K, capped at the live learners asked)
is in, the adaptive grace window admits more; then it merges with token weights (RDA), applies the
outer Nesterov step and sends the new version to every live learner. Work that missed its round is
merged into a later one, or refused past a bound (`late`). Time is an argument; nothing
here sleeps, reads a clock or touches the network, so the virtual-clock cluster and the networked
service drive exactly this code.

The core owns the rounds and composes the rest, each an object with its own state: the fragments'
global state (`sync_state.SyncState`: tensors, versions, outer optimizers; what is saved), the checks
a contribution must pass (`checks.ContributionChecks`), where late work goes (`late.LateRounds`:
the carries), the work taken from each learner (`taken.TakenWork`) and the grace window
(`timing.GraceWindow`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Collection, Iterable, Mapping, Sequence
from typing import Any

import torch

from .checks import ContributionChecks, measure
from .config import AlgorithmConfig
from .finishing import LearnersEnd
from .fragments import FragmentPlan
from .late import Carry, LateRounds, gather_until
from .merge_job import MergeDue, MergeJob, MergeResult
from .messages import (
    AdmittedWork,
    Contribution,
    Decline,
    FragmentRequest,
    FragmentUpdate,
    LearnerMessage,
    Merged,
    RejectCode,
    Rejected,
    SyncAction,
)
from .outer import NesterovOuterOptimizer
from .round_sum import AccumulatorPool, RoundSum
from .rounds import Round, RoundView
from .sync_state import SyncState
from .taken import TakenWork
from .timing import GraceWindow
from .weights import token_weight


class SynchronizerCore:
    """Global parameters, outer optimizer states and rounds for the fragments this shard owns."""

    measure = staticmethod(measure)  # a contribution's norms, for a driver that takes them before its lock

    def __init__(
        self,
        config: AlgorithmConfig,
        plan: FragmentPlan,
        params: Mapping[str, torch.Tensor],
        owned: Iterable[int] | None = None,
        plain_names: Collection[str] = (),
        defer_merges: bool = False,
        share_updates: bool = False,
    ) -> None:
        """`defer_merges`: a closed round comes out as a `MergeDue` action, whose job the driver
        computes (outside its lock, in another thread) and hands to `finish_merge`. Without it the
        core does both at once. Either way the result is the same.
        `share_updates`: a `FragmentUpdate` holds the live global tensors, not copies, for a driver
        that encodes each update before anything else reaches the core (the service, under its lock)."""
        if plan.num_fragments != config.fragments:
            raise ValueError(f"plan has {plan.num_fragments} fragments, config says P={config.fragments}")
        self.config = config
        self.plan = plan
        self.owned = sorted(set(range(plan.num_fragments) if owned is None else owned))
        if not self.owned or not all(0 <= p < plan.num_fragments for p in self.owned):
            raise ValueError(f"owned fragments must be a non-empty subset of 0..{plan.num_fragments - 1}")
        self.plain_names = frozenset(plain_names)
        self.state = SyncState(config, plan, self.owned, params)  # what a checkpoint holds (`sync_state`)
        self.checks = ContributionChecks(config, self.state)  # what a contribution must pass (`checks`)
        self.grace = GraceWindow(config.overlap, config.grace, config.ema, cover_pulls=config.rebases)
        self.live: set[int] = set()
        self.rounds: dict[int, Round] = {}
        self.sums = AccumulatorPool()  # the rounds' float32 sums, reused from round to round
        # work that missed its round; its stale correction reads each fragment's momentum buffers
        self.late = LateRounds(config, self.grace.step_time, self._new_sum, lambda p: self.state.outer[p].buffers)
        self.taken = TakenWork()  # no learner's work is taken twice (`taken`)
        self.rejections: dict[str, int] = {}  # refusals by code (`RejectCode` value)
        self._holding = False  # see receive(hold=...)
        self.defer_merges = defer_merges
        self.share_updates = share_updates
        self.merging: dict[int, MergeJob] = {}  # fragments whose merge is being computed
        self.final_flush = False  # the run has ended (budget, Stop, its learners): what merges now is the final flush
        self.flush_ends: float | None = None  # by when the final flush's rounds are merged (`begin_final_flush`)
        self.learners_end = LearnersEnd()  # the learners' own end of the run (`finishing`)

    # The state the drivers, checkpoints and status pages read (owned by the components).
    @property
    def params(self) -> dict[str, torch.Tensor]:
        """The owned fragments' global tensors, by name (live: merges change them in place)."""
        return self.state.params

    @property
    def versions(self) -> dict[int, int]:
        return self.state.versions

    @property
    def outer(self) -> dict[int, NesterovOuterOptimizer]:
        return self.state.outer

    @property
    def carries(self) -> dict[int, Carry]:
        """Late work waiting for its fragment's next round (`late`)."""
        return self.late.carries

    # --- membership -----------------------------------------------------------------------------
    def join(self, learner: int, now: float, restarted: bool = True) -> list[SyncAction]:
        """A new or returning learner gets every owned fragment at its current version. `restarted`:
        a new process (its steps count anew); False for the same process reconnecting."""
        self.live.add(learner)
        if restarted:
            self.taken.new_life(learner)
        if self.learners_end.joined(learner, restarted):  # the run goes on: the learners' flush ends
            self.final_flush, self.flush_ends = False, None
        return [self._update(p, (learner,)) for p in self.owned]

    def leave(self, learner: int, now: float, hold: bool = False) -> list[SyncAction | MergeDue]:
        """A learner failed or left: it is no longer waited for; rounds may now complete (unless
        `hold`: see `receive`)."""
        self.live.discard(learner)
        self._end_if_finished(now)
        return [] if hold else self._advance_all(now)

    def finishing(self, learner: int, now: float) -> None:
        """`learner` has finished its training loop (its final work, or its leaving for good, says so).
        Once no live learner trains, the final flush begins as at a budget's end (`finishing`)."""
        self.learners_end.finish(learner)
        self._end_if_finished(now)

    def _end_if_finished(self, now: float) -> None:
        if not self.final_flush and self.learners_end.over(self.live):
            window = self.learners_end.window
            self.begin_final_flush(None if window is None else now + window)
            self.learners_end.began = True

    def begin_final_flush(self, ends: float | None = None) -> None:
        """The run's budget is reached; with `final_momentum` off, later merges take no momentum.
        `ends`: by when (the clock of `now`) every round must have merged, the driver's drain less the
        time a merge and its updates take: no gathering window or grace runs past it (a round still
        open when the driver stops waiting would be abandoned, its accepted work never merged)."""
        self.final_flush = True
        self.flush_ends = ends
        self.learners_end.began = False  # a budget's or a Stop's flush never ends (`finishing`)

    def observe_step_time(self, seconds: float) -> None:
        self.grace.step_time.update(seconds)

    def observe_sync_time(self, seconds: float) -> None:
        """Merge + outer step + send, as measured by the driver (it owns the clock and the network)."""
        self.grace.sync_time.update(seconds)

    # --- messages -------------------------------------------------------------------------------
    def receive(
        self, message: LearnerMessage, now: float, hold: bool = False, norms: Mapping[str, float] | None = None
    ) -> list[SyncAction | MergeDue]:
        """`hold`: the driver has more messages queued behind this one at this instant. A round whose
        quorum and grace are met then waits for them instead of merging, so that with K = 1 (or no
        grace) every contribution already queued when the quorum is reached is admitted, not refused
        as stale a moment later. The next receive without `hold`, or `poll`, merges it.
        `norms`: `measure(message)`, when the driver took it already (outside its lock)."""
        if not isinstance(message, (Decline, Contribution)):
            raise TypeError(f"unexpected message {type(message).__name__}")
        self._holding = hold
        try:
            actions = (
                self._decline(message, now) if isinstance(message, Decline) else self._contribute(message, now, norms)
            )
        finally:
            self._holding = False
        return actions if hold else actions + self._advance_all(now)

    def _decline(self, decline: Decline, now: float) -> list[SyncAction | MergeDue]:
        current = self.rounds.get(decline.fragment)
        if current is None or current.version != decline.version or decline.learner not in self.live:
            return []
        current.declined.add(decline.learner)
        return self._advance(decline.fragment, now)

    def _contribute(
        self, c: Contribution, now: float, norms: Mapping[str, float] | None
    ) -> list[SyncAction | MergeDue]:
        if norms is None or set(norms) != set(c.outer_gradient):
            norms = measure(c)
        refusal = self.checks.refusal(c, norms, self.live)
        if refusal is not None:
            return self._reject(c.learner, c.fragment, *refusal)
        taken = self.taken.refusal(c)
        if taken is not None:
            return self._reject(c.learner, c.fragment, *taken)
        current_version = self.state.versions[c.fragment]
        if self.late.is_late(c, current_version, c.fragment in self.merging):
            return self._late(c, norms, now)
        if c.base_version > current_version:
            return self._reject(
                c.learner,
                c.fragment,
                RejectCode.UNKNOWN_VERSION,
                f"unknown version {c.base_version}: current is {current_version}",
            )
        current = self.rounds.get(c.fragment)
        requests: list[SyncAction] = []
        if current is None:
            carry = self.late.take(c.fragment)
            current = Round(
                version=current_version,
                opened_at=now,
                expected=set(self.live),
                total=carry.total if carry is not None else self._new_sum(c.fragment),
                late=carry.work if carry is not None else [],
            )
            self.rounds[c.fragment] = current
            others = tuple(sorted(current.expected - {c.learner}))
            if others:
                requests.append(FragmentRequest(c.fragment, current_version, others))
        elif c.learner in current.contributions:
            return self._reject(c.learner, c.fragment, RejectCode.DUPLICATE, "duplicate contribution for this round")
        if current.quorum_at is None:  # xi_step, tau, link: the learners that form quorums (see `timing`)
            self.grace.step_time.update(c.step_time)
            current.overlap = max(current.overlap, c.overlap)
            current.link = max(current.link, c.link_seconds)
        current.total.add(c.outer_gradient, token_weight(c.tokens, c.steps), norms)  # one pass per tensor
        current.contributions[c.learner] = dataclasses.replace(c, outer_gradient={})  # its tensors are summed
        self.taken.take(c)
        current.norms[c.learner] = norms
        current.declined.discard(c.learner)
        return requests + self._advance(c.fragment, now)

    def _late(self, c: Contribution, norms: Mapping[str, float], now: float) -> list[SyncAction | MergeDue]:
        """Work that missed its round: admitted into a later one (`late`), or refused; a learner whose
        base is out of date is sent the current version with the refusal."""
        p = c.fragment
        refusal = self.late.admit(c, norms, now, self.state.versions[p], p in self.merging, self.rounds.get(p))
        if refusal is None:
            self.taken.take(c)
            return []
        refused = self._reject(c.learner, p, refusal.code, refusal.reason)
        return refused + [self._update(p, (c.learner,))] if refusal.send_update else refused

    def _new_sum(self, p: int) -> RoundSum:
        """An empty running sum for a round (or carry) of fragment p: RDA over its tensors but the
        plain ones (embeddings: the weighted mean), or the weighted mean over all of them."""
        rda = frozenset(self.plan.names[p]) - self.plain_names if self.config.merge == "rda" else frozenset()
        return RoundSum(rda, self.sums)

    def _reject(self, learner: int, fragment: int | None, code: RejectCode, reason: str) -> list[SyncAction | MergeDue]:
        self.rejections[code.value] = self.rejections.get(code.value, 0) + 1
        return [Rejected(learner, fragment, reason, code)]

    # --- rounds ---------------------------------------------------------------------------------
    def poll(self, now: float, hold: bool = False) -> list[SyncAction | MergeDue]:
        """Close rounds whose grace window has ended (none while `hold`: see `receive`)."""
        return [] if hold else self._advance_all(now)

    def next_deadline(self) -> float | None:
        deadlines = [r.deadline for r in self.rounds.values() if r.deadline is not None]
        deadlines += self.late.deadlines(self._busy(), self.final_flush)
        return min(deadlines) if deadlines else None

    def _advance_all(self, now: float) -> list[SyncAction | MergeDue]:
        actions: list[SyncAction | MergeDue] = list(self._open_due_carries(now))
        for p in sorted(self.rounds):
            actions += self._advance(p, now)
        return actions

    def _busy(self) -> set[int]:
        """The fragments with a round open or a merge in progress."""
        return set(self.rounds) | set(self.merging)

    def _open_due_carries(self, now: float) -> list[SyncAction]:
        """Turn carries that waited their time into rounds of their own: due at once, or in the final
        flush gathering rounds that ask every live learner not heard from for the fragment."""
        requests: list[SyncAction] = []
        for p, carry in self.late.pop_due(now, self._busy(), self.final_flush):
            version = self.state.versions[p]
            if self.final_flush:
                self.rounds[p] = Round(
                    version=version,
                    opened_at=now,
                    expected=set(self.live),
                    total=carry.total,
                    quorum_at=now,
                    deadline=self._gather_until(now),
                    late=carry.work,
                )
                others = tuple(sorted(self.live - {w.contribution.learner for w in carry.work}))
                if others:
                    requests.append(FragmentRequest(p, version, others))
                continue
            self.rounds[p] = Round(
                version=version,
                opened_at=carry.since,
                expected=set(),
                total=carry.total,
                quorum_at=now,
                deadline=now,
                late=carry.work,
            )
        return requests

    def _gather_until(self, opened_at: float) -> float:
        """In the final flush: until when a round opened at `opened_at` waits for everyone (`late`)."""
        return gather_until(opened_at, self.config.sync_every, self.grace.step_time.get(), self.flush_ends)

    def _waiting_for(self, r: Round) -> set[int]:
        heard = set(r.contributions) | r.declined
        if self.final_flush:  # a learner's last work may be late work; it is all that will come
            heard |= {w.contribution.learner for w in r.late}
        return {m for m in r.expected & self.live if m not in heard}

    def _need(self, r: Round) -> int:
        """K, capped at the live learners that can still contribute (and those who did).

        A learner that declined has nothing for this version, so waiting for it would hang the round
        whenever K exceeds the learners that can answer.
        """
        able = ((r.expected & self.live) - r.declined) | set(r.contributions)
        return min(self.config.quorum, max(1, len(able)))

    def open_rounds(self) -> list[RoundView]:
        return [
            RoundView(
                fragment=p,
                version=r.version,
                opened_at=r.opened_at,
                quorum_at=r.quorum_at,
                deadline=r.deadline,
                need=self._need(r),
                contributors=tuple(sorted(r.contributions)),
                declined=tuple(sorted(r.declined)),
                waiting_for=tuple(sorted(self._waiting_for(r))),
                live=tuple(sorted(self.live)),
                late=tuple(sorted(w.contribution.learner for w in r.late)),
            )
            for p, r in sorted(self.rounds.items())
        ]

    def holding(self, learner: int) -> dict[int, int]:
        """Fragment -> base version of `learner`'s work taken but not merged yet (a round, a carry, a
        merge in progress): a learner reconnecting must not send it again (`taken`)."""
        out: dict[int, int] = {}
        pieces = [(p, c) for p, r in self.rounds.items() for c in r.contributions.values()]
        pieces += [(p, w.contribution) for p, r in self.rounds.items() for w in r.late]
        pieces += [(p, w.contribution) for p, carry in self.late.carries.items() for w in carry.work]
        pieces += [(p, c) for p, job in self.merging.items() for c in job.contributions]
        for p, c in pieces:
            if c.learner == learner:
                out[p] = max(out.get(p, c.base_version), c.base_version)
        return out

    def _advance(self, p: int, now: float) -> list[SyncAction | MergeDue]:
        r = self.rounds[p]
        waiting_for = self._waiting_for(r)
        need = self._need(r)
        if r.quorum_at is None and len(r.contributions) >= need:
            r.quorum_at = now
            r.deadline = now + self.grace.length(now - r.opened_at, r.overlap, r.link)
            if self.final_flush:  # the last work of everyone, merged in one outer step (`late`)
                r.deadline = max(r.deadline, self._gather_until(r.opened_at))
        if self.final_flush:
            # The gathering window runs from the round's opening whether a quorum comes or not (with
            # K > 1 it may never come: nothing later will), and every deadline ends by the flush's end.
            if r.deadline is None:
                r.deadline = self._gather_until(r.opened_at)
            if self.flush_ends is not None:
                r.deadline = min(r.deadline, self.flush_ends)
        ready = r.quorum_at is not None or (self.final_flush and bool(r.contributions or r.late))
        due = ready and (not waiting_for or (r.deadline is not None and now >= r.deadline))
        return self._merge(p, now) if due and not self._holding else []

    def _merge(self, p: int, now: float) -> list[SyncAction | MergeDue]:
        r = self.rounds.pop(p)
        learners = sorted(r.contributions)
        contributions = tuple(r.contributions[m] for m in learners) + tuple(w.contribution for w in r.late)
        weights = [token_weight(c.tokens, c.steps) for c in contributions[: len(learners)]]
        weights += [w.weight for w in r.late]
        if r.total.equal_weights:  # every contributor trained on zero tokens: nothing to learn from
            weights = [1.0] * len(contributions)
        names = self.plan.names[p]
        job = MergeJob(
            fragment=p,
            version=r.version,
            contributions=contributions,
            weights=tuple(weights),
            norms=tuple(r.norms[m] for m in learners) + tuple(w.norms for w in r.late),
            total=r.total,
            # the final flush, and a finished learner's last work (a tail of a few steps), take no momentum
            use_momentum=self.config.final_momentum
            or not (self.final_flush or self.learners_end.tail(c.learner for c in contributions)),
            params={n: self.state.params[n] for n in names},
            outer=self.state.outer[p],
            opened_at=r.opened_at,
            quorum_at=r.quorum_at,
            deadline=r.deadline,
            expected=len(r.expected),
        )
        self.merging[p] = job
        if self.defer_merges:
            return [MergeDue(job)]
        return self.finish_merge(job, job.compute(), now)

    def finish_merge(self, job: MergeJob, result: MergeResult, now: float) -> list[SyncAction | MergeDue]:
        """Apply a computed merge: the outer step in place, the new version, its update to every live
        learner. A refused step (it would make the fragment non-finite) commits nothing, keeps the
        version and resets every contributor to the global value (the round's work is counted lost)."""
        p = job.fragment
        if self.merging.get(p) is not job:
            raise ValueError(f"fragment {p}: no merge of version {job.version} is pending")
        del self.merging[p]
        if result.error is not None:
            job.total.release()
            for c in job.contributions:  # not merged: their learners may send this work again
                self.taken.give_back(c)
            reason = f"merge refused: fragment {p} would become non-finite ({result.error})"
            return [a for c in job.contributions for a in self._reject(c.learner, p, RejectCode.MERGE_REFUSED, reason)]
        learners = [c.learner for c in job.contributions]
        self.state.step(p, result.scaled, job.use_momentum, learners, len(job.contributions))
        job.total.release()
        admitted = tuple(
            AdmittedWork(c.learner, c.step, c.steps, c.tokens, c.seconds, w, c.base_version)
            for c, w in zip(job.contributions, job.weights, strict=True)
        )
        record = Merged(
            fragment=p,
            version=self.state.versions[p],
            time=now,
            opened_at=job.opened_at,
            quorum_time=(job.quorum_at if job.quorum_at is not None else now) - job.opened_at,
            grace=(job.deadline if job.deadline is not None else now)
            - (job.quorum_at if job.quorum_at is not None else now),
            admitted=admitted,
            expected=job.expected,
            merged_norm=result.merged_norm,
            contribution_norm=job.contribution_norm(),
        )
        return [record, self._update(p, tuple(sorted(self.live)))]

    def _update(self, p: int, learners: Sequence[int]) -> FragmentUpdate:
        return self.state.update(p, learners, copy=not self.share_updates)

    def current_update(self, p: int, learners: Sequence[int]) -> FragmentUpdate:
        """The current global value of fragment p, addressed to `learners` (a copy: safe to send)."""
        if p not in self.state.versions:
            raise KeyError(f"fragment {p} is not owned by this synchronizer")
        return self.state.update(p, learners, copy=True)

    # --- state ----------------------------------------------------------------------------------
    def global_params(self) -> dict[str, torch.Tensor]:
        return self.state.global_params()

    def detach_fragment(self, p: int) -> None:
        """Fragment p's global tensors get storage of their own before the next merge steps them in
        place, for a driver that reads the current ones outside its lock (`SyncState.detach`)."""
        if p not in self.state.versions:
            raise KeyError(f"fragment {p} is not owned by this synchronizer")
        self.state.detach(p)

    def fragment_state(self, p: int, copy: bool = True) -> dict[str, torch.Tensor]:
        """Fragment p's global tensors and outer-optimizer buffers (`SyncState.fragment_state`)."""
        return self.state.fragment_state(p, copy)

    def state_dict(self) -> dict[str, Any]:
        """Everything needed to resume: parameters, versions, outer optimizer buffers, estimates."""
        return {
            **self.state.state_dict(),
            "grace": self.grace.state_dict(),
            "rejections": dict(self.rejections),
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Resume from `state_dict`: work held in rounds and carries is not saved, so it is dropped, and
        late work from before the restore is refused (it may have been merged already)."""
        self.state.load_state_dict(state)
        self.grace.load_state_dict(state.get("grace", {}))
        self.rejections = dict(state.get("rejections", {}))
        self.rounds.clear()
        self.late.restart(self.state.versions)
        self.taken.clear()
