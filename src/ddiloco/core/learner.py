"""The learner's side of Decoupled DiLoCo (Algorithm 1), called by a training loop at step boundaries.

It holds live references to the model's parameters and overwrites them in place when a global
fragment arrives, so the user's inner optimizer (and its state) is untouched.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from dataclasses import dataclass

import torch

from .fragments import FragmentPlan
from .merge import outer_gradient
from .messages import (
    Contribution,
    Decline,
    FragmentRequest,
    FragmentUpdate,
    LearnerMessage,
)
from .schedule import Schedule
from .timing import Ema


@dataclass
class FragmentCounters:
    """Work since the learner last received this fragment."""

    steps: int = 0
    tokens: int = 0
    seconds: float = 0.0

    def add(self, tokens: int, seconds: float) -> None:
        self.steps += 1
        self.tokens += tokens
        self.seconds += seconds

    def reset(self) -> None:
        self.steps, self.tokens, self.seconds = 0, 0, 0.0


class LearnerCore:
    """Per-fragment counters, versions and snapshots for one learner.

    Call order per step: the training loop takes its inner step, then `after_step(tokens, seconds)`,
    which applies fragments that have arrived (overwrite + reset), and returns the messages to send.
    With overlap 0 (blocking syncs) the driver must wait while `must_wait()` and call
    `apply_arrivals()` when the update is in. A driver whose parameters live elsewhere (sharded over
    ranks) splits the step: `begin_step`, then `due()` names the fragments whose current value
    `collect()` will read, so it can gather just those first.

    The base copy Theta_p of each fragment is kept in fp32 on `base_device` (the host by default), not
    beside the parameters: accelerator memory holds the model once.
    """

    def __init__(
        self,
        learner_id: int,
        params: Mapping[str, torch.Tensor],
        plan: FragmentPlan,
        schedule: Schedule,
        answer_requests: bool | None = None,
        base_device: torch.device | str = "cpu",
        ema: float = 0.2,
        rebase: bool = False,
        stage: Callable[[int, Mapping[str, torch.Tensor]], Mapping[str, torch.Tensor]] | None = None,
        late_merged: bool = True,
        synchronous: bool = False,
    ) -> None:
        """`ema`: smoothing of the step time sent with each contribution (`AlgorithmConfig.ema`);
        `rebase`: keep local progress when a global value arrives (`AlgorithmConfig.arrival`);
        `stage(fragment, base)`: the outer gradients Theta - theta of a snapshot, from the fragment's
        base values; a driver passes one that copies now and subtracts later, in another thread
        (`learner.staging`). Default: computed here. `late_merged`: the synchronizer merges work that
        missed its round into a later one (`AlgorithmConfig.late` "merge"), so a snapshot an update did
        not take is still on its way, not unsent work to keep. `synchronous`: wait for a fragment once it
        is more than tau steps overdue (`must_wait`), contribute only on our own schedule (Streaming DiLoCo)."""
        missing = set(plan.all_names()) - set(params)
        if missing:
            raise KeyError(f"model lacks parameters named in the fragment plan: {sorted(missing)[:5]}")
        if plan.num_fragments != schedule.num_fragments:
            raise ValueError(f"plan has {plan.num_fragments} fragments, schedule {schedule.num_fragments}")
        self.id = learner_id
        self.base_device = torch.device(base_device)
        self.params = params
        self.plan = plan
        self.schedule = schedule
        # Blocking (tau = 0) learners contribute only on their own schedule: answering a pull early
        # would cut the outer step short of H inner steps, which classic DiLoCo never does.
        # So do synchronous (Streaming DiLoCo) learners: every learner sends each fragment after H steps.
        self.synchronous = synchronous
        default_answer = schedule.overlap > 0 and not synchronous
        self.answer_requests = default_answer if answer_requests is None else answer_requests
        num = plan.num_fragments
        self.step = 0
        self.joined = False
        self.counters = [FragmentCounters() for _ in range(num)]
        self.anchors = [0] * num
        self.versions = [-1] * num
        self.base: list[dict[str, torch.Tensor]] = [{} for _ in range(num)]
        self.pending: list[int | None] = [None] * num  # version we contributed against, awaiting its update
        self.requested: dict[int, int] = {}
        self.inbox: dict[int, FragmentUpdate] = {}
        self.step_time = Ema(ema)
        self.stopped = False  # flushed at the end of training: requests are answered or declined
        self.rebase = rebase
        self.late_merged = late_merged
        # Token accounting by cause (each weighed by its fragment's share of the parameters, as merged
        # tokens are): what left in contributions, and what an arriving value overwrote unsent.
        self.tokens_sent = 0.0
        self.tokens_overwritten = 0.0
        self._snapshot_tokens = [0] * num  # the tokens of the pending contribution, per fragment
        self.overlap = schedule.overlap  # tau; a driver with `--overlap auto` changes it (`learner.overlap`)
        self.link_seconds = 0.0  # the driver's measured link time, sent with each contribution
        self.stage = stage
        self.at_snapshot: list[tuple[dict[str, torch.Tensor], FragmentCounters] | None] = [None] * num
        self.forced: set[int] = set()  # repairs always overwrite (the local value may be broken)
        # the step at which a global value last came into the model (join or arrival): a driver's
        # learning-rate schedule may warm up again from there (`train.inner.lr_at`, rewarm_steps)
        self.adopted_at: int | None = None

    # --- arrivals -------------------------------------------------------------------------------
    def join(self, updates: list[FragmentUpdate]) -> None:
        """Start from the current global parameters: overwrite everything, counters at zero."""
        got = {u.fragment for u in updates}
        if got != set(range(self.plan.num_fragments)):
            raise ValueError(f"join needs every fragment once, got {sorted(got)}")
        for update in updates:
            self._overwrite(update)
            self.anchors[update.fragment] = self.step + self.schedule.offset(update.fragment) - self.overlap
        # Requests that reached us while the state was in flight are kept: they are answered at the
        # first boundary (declined if we have not stepped, so a fresh learner never drags the model).
        self.inbox.clear()
        self.joined = True
        self.adopted_at = self.step

    def receive(self, update: FragmentUpdate) -> None:
        """Queue a global fragment; it is applied at the next step boundary. Old versions are ignored."""
        held = self.versions[update.fragment]
        queued = self.inbox.get(update.fragment)
        if queued is not None:
            held = max(held, queued.version)
        if update.version > held:
            self.inbox[update.fragment] = update

    def force(self, update: FragmentUpdate) -> None:
        """Queue `update` even if we hold that version or a newer one.

        For repairs only: after a refused contribution (the local fragment may hold NaN) or after a
        synchronizer restarted from a checkpoint older than what we hold. Applied at the next
        boundary like any update: overwrite, counters reset, pending cleared.
        """
        self.inbox[update.fragment] = update
        self.forced.add(update.fragment)

    def retry(self, fragment: int, version: int) -> bool:
        """Forget a contribution against `version` that was refused or lost, and make it due now.

        The work is then sent again at the next boundary, with what was trained since. Without this a
        learner whose contribution vanished (a synchronizer crash) would wait for an update that never
        comes and, with blocking syncs, wait forever. Returns False if nothing was awaited.
        """
        if self.pending[fragment] != version:
            return False
        self.pending[fragment] = None
        self.tokens_sent -= self._snapshot_tokens[fragment] * self.plan.share(fragment)  # it goes again
        self.anchors[fragment] = self.step - self.schedule.period
        return True

    def acknowledge(self, fragment: int, version: int) -> bool:
        """Our pending contribution to `fragment` went into `version`, whose values we will not take.

        Only after `flush()`: a learner that is leaving needs to know its work was counted, not the
        new values (the final model is the synchronizer's), so the update comes down as a notice without
        tensors. The fragment's parameters and version stay as they were; its pending work is done.
        Returns False (and changes nothing) if no contribution against an older version is awaited.
        """
        if not self.stopped:
            raise RuntimeError("acknowledge() is for a learner that has flushed; apply updates with receive()")
        pending = self.pending[fragment]
        if pending is None or version <= pending:
            return False
        self.pending[fragment] = None
        self.at_snapshot[fragment] = None
        self.counters[fragment].reset()  # no steps since the flush: the snapshot held all the work
        return True

    def request(self, request: FragmentRequest) -> None:
        if self.id in request.learners:
            self.requested[request.fragment] = request.version

    def apply_arrivals(self) -> list[int]:
        """Overwrite theta_p <- Theta_p and reset counters for every queued fragment."""
        applied = []
        for fragment in sorted(self.inbox):
            update = self.inbox.pop(fragment)
            contributed = self.pending[fragment] is not None
            if self.rebase and fragment not in self.forced:
                self._rebase(update)
            else:
                self._overwrite(update)
            self.forced.discard(fragment)
            if not contributed and self.counters[fragment].steps == 0:
                # Align with the cadence of those who did contribute: as if we had sent tau steps ago.
                # Not while re-based work is kept unsent: a learner slower than the others would have
                # its clock put back by every update that comes before its own send is due, and never
                # send that fragment (its work piling up, in its own model, until the final flush).
                self.anchors[fragment] = self.step - self.overlap
            applied.append(fragment)
        if applied:
            self.adopted_at = self.step
        return applied

    def _checked_names(self, update: FragmentUpdate) -> tuple[str, ...]:
        names = self.plan.names[update.fragment]
        if set(update.tensors) != set(names):
            raise ValueError(
                f"update for fragment {update.fragment} carries {sorted(update.tensors)}, expected {sorted(names)}"
            )
        return names

    def _rebase(self, update: FragmentUpdate) -> None:
        """theta <- Theta_new + (theta - reference): the reference is theta at our pending snapshot
        (its work went into the global value), else the last global value (all our work is unsent).
        Where late work is refused (`late_merged` False), a snapshot the merge that made `update` did
        not take is unsent work too: it is kept and goes with the next contribution, re-based onto the
        version it missed, its tokens counted once. Where that is not known, the snapshot counts as sent."""
        p, names = update.fragment, self._checked_names(update)
        pending = self.pending[p]
        missed = (
            not self.late_merged
            and pending is not None
            and update.merged is not None
            and update.version == pending + 1
            and self.id not in update.merged
        )
        if missed:  # the refused snapshot's work goes again with the next contribution
            self.tokens_sent -= self._snapshot_tokens[p] * self.plan.share(p)
        snap = self.at_snapshot[p] if pending is not None and not missed else None
        reference = snap[0] if snap is not None else self.base[p]
        if snap is None:
            kept = dataclasses.replace(self.counters[p])
        else:
            c, s = self.counters[p], snap[1]
            kept = FragmentCounters(c.steps - s.steps, c.tokens - s.tokens, c.seconds - s.seconds)
        with torch.no_grad():
            for name in names:
                value = update.tensors[name]
                param = self.params[name]
                local = param.detach().to(self.base_device, torch.float32) - reference[name]
                new = value.detach().to(self.base_device, torch.float32) + local
                param.copy_(new.to(param.device, param.dtype))
                self.base[p][name] = value.detach().to(self.base_device, torch.float32, copy=True)
        self.versions[p] = update.version
        self.counters[p] = kept
        self.pending[p] = None
        self.at_snapshot[p] = None

    def _overwrite(self, update: FragmentUpdate) -> None:
        p, names = update.fragment, self._checked_names(update)
        sent = self._snapshot_tokens[p] if self.pending[p] is not None else 0
        self.tokens_overwritten += max(0, self.counters[p].tokens - sent) * self.plan.share(p)
        with torch.no_grad():
            for name in names:
                value = update.tensors[name]
                self.params[name].copy_(value, non_blocking=True)  # asynchronous from pinned host memory
                keep = update.owned and value.dtype == torch.float32 and value.device == self.base_device
                self.base[p][name] = (
                    value.detach() if keep else value.detach().to(self.base_device, torch.float32, copy=True)
                )
        self.versions[p] = update.version
        self.counters[p].reset()
        self.pending[p] = None
        self.at_snapshot[p] = None

    # --- steps ----------------------------------------------------------------------------------
    def after_step(self, tokens: int, seconds: float) -> list[LearnerMessage]:
        """Count one inner step, apply arrived fragments, and return contributions and declines."""
        self.begin_step(tokens, seconds)
        return self.collect()

    def begin_step(self, tokens: int, seconds: float) -> list[int]:
        """The first half of `after_step`: count the step, apply arrivals; returns the applied fragments."""
        if not self.joined:
            raise RuntimeError("learner has not joined: call join() with the global parameters first")
        if tokens < 0 or seconds < 0:
            raise ValueError(f"tokens and seconds must be >= 0, got {tokens}, {seconds}")
        self.step += 1
        self.step_time.update(seconds)
        for counters in self.counters:
            counters.add(tokens, seconds)
        return self.apply_arrivals()

    def due(self) -> list[int]:
        """The fragments `collect()` would snapshot now (nothing is consumed)."""
        return [p for p in range(self.plan.num_fragments) if self._decide(p, self.requested.get(p)) is None]

    def _decide(self, p: int, asked: int | None) -> Decline | str | None:
        """None: snapshot p now; a Decline: answer a request with it; a string: nothing to send.

        A synchronous learner that waits for a merge answers requests too: the round it waits on may
        need another learner that itself waits for this learner's fragment, which on its own schedule
        comes only after the wait (a learner that joined mid-round, with its steps out of phase). Its
        outer step for that fragment is cut short once, and both schedules go on from there."""
        if not self.answer_requests and not self.stopped and not (self.synchronous and self.must_wait()):
            asked = None
        if self.pending[p] is not None:
            if asked is not None and asked != self.pending[p]:
                return Decline(self.id, p, asked, "an update is in flight to this learner")
            return "in flight"
        if asked is not None:
            if asked != self.versions[p]:
                return Decline(self.id, p, asked, f"holds version {self.versions[p]}")
            if self.counters[p].steps == 0:
                return Decline(self.id, p, asked, "no steps since the last update")
            return None
        if self.schedule.is_due(self.step, self.anchors[p]) and self.counters[p].steps > 0:
            return None
        return "not due"

    def collect(self) -> list[LearnerMessage]:
        """Snapshots of fragments due on our own schedule or asked for by the synchronizer."""
        out: list[LearnerMessage] = []
        for p in range(self.plan.num_fragments):
            decision = self._decide(p, self.requested.pop(p, None))
            if decision is None:
                out.append(self._snapshot(p))
            elif isinstance(decision, Decline):
                out.append(decision)
        return out

    def flush(self) -> list[LearnerMessage]:
        """At the end of training: send every fragment that holds unsent work, due or not, and decline
        requests for the others. From now on every request is answered (`collect`), blocking mode
        too: a stopped learner that stayed silent would hold a round that waits for all (K = M) open."""
        self.stopped = True
        out: list[LearnerMessage] = []
        for p in range(self.plan.num_fragments):
            asked = self.requested.pop(p, None)
            if self.pending[p] is None and self.counters[p].steps > 0:
                out.append(self._snapshot(p))
                continue
            decision = self._decide(p, asked)
            if isinstance(decision, Decline):
                out.append(decision)
        return out

    def _snapshot(self, p: int) -> Contribution:
        base = {n: self.base[p][n] for n in self.plan.names[p]}
        if self.stage is not None:
            grads = self.stage(p, base)
        else:
            with torch.no_grad():
                grads = {n: outer_gradient(b, self.params[n].detach().to(b.device)) for n, b in base.items()}
        c = self.counters[p]
        if self.rebase:  # what arrives later is re-based from here
            self.at_snapshot[p] = (
                {
                    name: self.params[name].detach().to(self.base_device, torch.float32, copy=True)
                    for name in self.plan.names[p]
                },
                dataclasses.replace(c),
            )
        self.pending[p] = self.versions[p]
        self.anchors[p] = self.step
        self._snapshot_tokens[p] = c.tokens
        self.tokens_sent += c.tokens * self.plan.share(p)
        return Contribution(
            learner=self.id,
            fragment=p,
            base_version=self.versions[p],
            outer_gradient=grads,
            steps=c.steps,
            tokens=c.tokens,
            seconds=c.seconds,
            step_time=self.step_time.get(),
            step=self.step,
            overlap=self.overlap,
            link_seconds=self.link_seconds,
        )

    def must_wait(self) -> bool:
        """Whether the next step must wait for a fragment we sent: with overlap 0 (blocking syncs) until
        each comes back; when `synchronous`, once one is more than tau steps overdue (`overdue`)."""
        if self.schedule.overlap == 0:
            return any(v is not None for v in self.pending)
        # while a contribution is pending, its fragment's anchor is the step it was sent at (`_snapshot`)
        return self.synchronous and any(
            v is not None and overdue(self.step + 1, self.anchors[p], self.overlap) for p, v in enumerate(self.pending)
        )


def overdue(step: int, sent_at: int, overlap: int) -> bool:
    """Streaming DiLoCo's rule: step `step` may run without the merged value of a fragment sent after
    step `sent_at` only while it is one of the tau overlapped steps (sent_at + 1 .. sent_at + tau); a
    later step waits for it. tau = 0 waits at once: synchronous DiLoCo."""
    return step > sent_at + overlap
