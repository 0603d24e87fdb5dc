"""The virtual-clock cluster: M learners and a synchronizer, driven by a discrete-event queue.

Training is real (each learner's model takes real AdamW steps on its own data shard); only time is
simulated, from the hardware model. The learners and the synchronizer are the pure cores of
`ddiloco.core`, so what runs here is exactly the algorithm the networked runtime runs. Synchronous
DiLoCo is this same driver with one fragment, blocking syncs and K = M.
"""

from __future__ import annotations

import copy
import dataclasses
import time
from collections.abc import Callable

import torch

from ..core import (
    Contribution,
    Decline,
    FragmentRequest,
    FragmentUpdate,
    LearnerCore,
    Merged,
    Rejected,
    Schedule,
    SynchronizerCore,
    plan_for_model,
)
from ..train.inner import inner_step, lr_at, make_inner_optimizer, set_lr
from ..train.tasks import Task
from ..wire import quant
from .config import SimConfig
from .events import EventQueue
from .learner import SimLearner
from .ledger import WorkLedger

Progress = Callable[[float, dict], None]
Observer = Callable[[str, float, dict], None]


class DecoupledCluster:
    def __init__(
        self, config: SimConfig, task: Task, progress: Progress | None = None, observer: Observer | None = None
    ) -> None:
        """`observer(kind, time, details)` hears of every down, up, joined and merged event."""
        self.config = config
        self.observe = observer or (lambda kind, time, details: None)
        self.algorithm = config.effective_algorithm()
        self.task = task
        self.progress = progress
        template = task.build_model(config.seed)
        params = dict(template.named_parameters())
        self.plan = plan_for_model(params, self.algorithm.fragments)
        self.schedule = Schedule(self.algorithm.fragments, self.algorithm.sync_every, self.algorithm.overlap)
        self.sync = SynchronizerCore(self.algorithm, self.plan, params, plain_names=task.embedding_names)
        self.eval_model = template
        self.learners = []
        for m in range(config.learners):
            model = copy.deepcopy(template)
            self.learners.append(
                SimLearner(
                    id=m,
                    model=model,
                    optimizer=make_inner_optimizer(model, config.inner),
                    stream=task.stream(m, config.learners, config.batch_size(m), config.seed),
                    sample_step_time=config.steps.sampler(m, config.seed),
                )
            )
        self.queue = EventQueue()
        self.ledger = WorkLedger(config.learners)
        self.tokens_trained = 0
        self.draining = False
        self.merges = 0
        self.contributions = 0
        self.rejected = 0
        self.rejections: list[str] = []
        self._polls: set[float] = set()
        self._senders: dict[tuple[int, int, int], int] = {}  # (learner, fragment, base version) -> incarnation
        self._last_merge_time = 0.0
        self.longest_gap = 0.0
        self.codec = quant.get(config.codec) if config.codec is not None else None
        self.peak_send_bytes = 0.0  # the most one learner sent after one training step (not the final flush)
        self.norm_ratios: list[float] = []  # merged / contributions' outer-gradient norm, per merge

    # --- the event loop -------------------------------------------------------------------------
    def run(self) -> dict:
        wall_start = time.perf_counter()
        for m in range(self.config.learners):
            self.queue.push(0.0, ("up", m))
        for outage in self.config.failures.outages:
            self.queue.push(outage.down_at, ("down", outage.learner))
            if outage.up_at != float("inf"):
                self.queue.push(outage.up_at, ("up", outage.learner))
        handlers: dict[str, Callable[..., None]] = {
            "up": self._on_up,
            "down": self._on_down,
            "step_done": self._on_step_done,
            "at_sync": self._on_at_sync,
            "at_learner": self._on_at_learner,
            "poll": self._on_poll,
        }
        end_time = 0.0
        while self.queue:
            now, event = self.queue.pop()
            if self.draining and event[0] in ("up", "down"):
                continue
            if event[0] == "poll" and self._stale_poll(now):
                continue  # its round merged early (all answered): an idle timer does not stretch the run
            handlers[event[0]](now, *event[1:])
            end_time = now
        self.longest_gap = max(self.longest_gap, end_time - self._last_merge_time)
        summary = self.ledger.summary(end_time)
        return {
            **summary,
            "sim_seconds": end_time,
            "wall_seconds": time.perf_counter() - wall_start,
            "outer_steps": self.merges,
            "contributions": self.contributions,
            "rejected_contributions": self.rejected,
            "longest_gap_seconds": self.longest_gap,
            "fragments": self.algorithm.fragments,
            "peak_step_bytes": self.peak_send_bytes,
            "wait_seconds": sum(learner.waited for learner in self.learners),  # held back by synchronous syncs
            "outer_norm_ratio": sum(self.norm_ratios) / len(self.norm_ratios) if self.norm_ratios else None,
        }

    def global_model(self) -> torch.nn.Module:
        with torch.no_grad():
            for name, p in self.eval_model.named_parameters():
                p.copy_(self.sync.params[name])
        return self.eval_model

    # --- membership -----------------------------------------------------------------------------
    def _on_up(self, now: float, m: int) -> None:
        learner = self.learners[m]
        if learner.state != "down":
            return
        self.observe("up", now, {"learner": m})
        learner.state = "joining"
        learner.joining = {}
        learner.inner_steps = 0
        learner.core = LearnerCore(
            m,
            dict(learner.model.named_parameters()),
            self.plan,
            self.schedule,
            ema=self.algorithm.ema,
            rebase=self.algorithm.rebases,
            late_merged=self.algorithm.late == "merge",
            synchronous=self.algorithm.synchronous,
        )
        if now > 0:
            learner.optimizer = self._rejoin_optimizer(learner)
        self._dispatch(self.sync.join(m, now), now)

    def _rejoin_optimizer(self, learner: SimLearner) -> torch.optim.Optimizer:
        """A restarted learner loses its inner optimizer; like the paper, copy a healthy peer's."""
        fresh = make_inner_optimizer(learner.model, self.config.inner)
        if self.config.rejoin_optimizer == "peer":
            peers = [p for p in self.learners if p.state in ("stepping", "waiting") and p.id != learner.id]
            if peers:
                fresh.load_state_dict(copy.deepcopy(peers[0].optimizer.state_dict()))
                learner.inner_steps = peers[0].inner_steps
        return fresh

    def _on_down(self, now: float, m: int) -> None:
        learner = self.learners[m]
        if learner.state == "down":
            return
        self.observe("down", now, {"learner": m})
        self._end_wait(learner, now)
        learner.state = "down"
        learner.incarnation += 1  # everything in flight to or from the old process is lost
        learner.core = None
        self._dispatch(self.sync.leave(m, now), now)

    # --- learners -------------------------------------------------------------------------------
    def _end_wait(self, learner: SimLearner, now: float) -> None:
        if learner.state == "waiting":
            learner.waited += now - learner.wait_since

    def _start_step(self, learner: SimLearner, now: float) -> None:
        self._end_wait(learner, now)
        learner.state = "stepping"
        learner.step_started = now
        learner.step_duration = learner.sample_step_time()
        self.queue.push(now + learner.step_duration, ("step_done", learner.id, learner.incarnation))

    def _on_step_done(self, now: float, m: int, incarnation: int) -> None:
        learner = self.learners[m]
        if incarnation != learner.incarnation or learner.state != "stepping":
            return
        batch = learner.stream.next()
        core = learner.live_core
        since = core.step - core.adopted_at if core.adopted_at is not None else None
        set_lr(
            learner.optimizer,
            lr_at(self.config.inner, learner.inner_steps, self.tokens_trained / self.config.tokens, since),
        )
        loss = self.task.loss(learner.model, batch)
        inner_step(learner.model, learner.optimizer, loss, self.config.inner.grad_clip)
        learner.inner_steps += 1
        index = self.ledger.step(m, learner.incarnation, learner.step_started, now, batch.tokens)
        self.tokens_trained += batch.tokens
        messages = learner.live_core.after_step(batch.tokens, learner.step_duration)
        assert index == learner.live_core.step
        self._send(learner, messages, now, after_step=True)
        if self.progress is not None:
            self.progress(
                min(1.0, self.tokens_trained / self.config.tokens),
                {"loss": float(loss.detach()), "time": now, "tokens": self.tokens_trained},
            )
        if self.tokens_trained >= self.config.tokens:
            self._drain(now)
        elif learner.live_core.must_wait():
            learner.state, learner.wait_since = "waiting", now
        else:
            self._start_step(learner, now)

    def _drain(self, now: float) -> None:
        """Training is over: every live learner sends the work it still holds, then the merges finish."""
        self.draining = True
        self.sync.begin_final_flush()
        for learner in self.learners:
            if learner.state in ("stepping", "waiting"):
                self._end_wait(learner, now)
                learner.state = "stopped"
                self._send(learner, learner.live_core.flush(), now)
            elif learner.state == "joining":
                learner.state = "stopped-joining"

    def _on_at_learner(self, now: float, m: int, incarnation: int, message: object) -> None:
        learner = self.learners[m]
        if incarnation != learner.incarnation or learner.core is None:
            return
        core = learner.core
        if isinstance(message, FragmentRequest):
            core.request(message)
            if learner.state in ("waiting", "stopped"):
                self._send(learner, core.collect(), now)
            return
        assert isinstance(message, FragmentUpdate)
        if learner.state in ("joining", "stopped-joining"):
            held = learner.joining.get(message.fragment)
            if held is None or message.version > held.version:
                learner.joining[message.fragment] = message
            if len(learner.joining) == self.plan.num_fragments:
                core.join(list(learner.joining.values()))
                self.observe("join", now, {"learner": m, "versions": list(core.versions), "params": core.params})
                if learner.state == "stopped-joining":
                    learner.state = "stopped"
                    self._send(learner, core.collect(), now)
                else:
                    self._start_step(learner, now)
            return
        core.receive(message)
        if learner.state == "waiting":
            core.apply_arrivals()
            if not core.must_wait():
                self._start_step(learner, now)
        elif learner.state == "stopped":
            core.apply_arrivals()

    def _send(self, learner: SimLearner, messages: list, now: float, after_step: bool = False) -> None:
        """Messages onto the link; `after_step` counts them towards the peak bytes of one step."""
        link = self.config.link
        sent = 0.0
        for message in messages:
            if isinstance(message, Contribution):
                message, size = self._encode(message)
                sent += size
                arrival = now + link.transfer(size)
            else:
                arrival = now + link.latency
            self.queue.push(arrival, ("at_sync", learner.id, learner.incarnation, message))
        if after_step:
            self.peak_send_bytes = max(self.peak_send_bytes, sent)

    def _encode(self, c: Contribution) -> tuple[Contribution, float]:
        """What the synchronizer receives, and the bytes it takes on the link."""
        if self.codec is None:
            return c, self.plan.sizes[c.fragment] * self.config.wire_bytes_per_param
        shapes = {n: tuple(t.shape) for n, t in c.outer_gradient.items()}
        received = {n: self.codec.decode(self.codec.encode(t), shapes[n]) for n, t in c.outer_gradient.items()}
        return dataclasses.replace(c, outer_gradient=received), float(
            sum(self.codec.nbytes(s) for s in shapes.values())
        )

    # --- synchronizer ---------------------------------------------------------------------------
    def _on_at_sync(self, now: float, m: int, incarnation: int, message: Contribution | Decline) -> None:
        if incarnation != self.learners[m].incarnation:
            return  # the sender died before its message got through
        nxt = self.queue.peek()
        hold = nxt is not None and nxt[0] == now and nxt[1][0] == "at_sync"  # more arrive at this instant
        if not isinstance(message, Contribution):
            self._dispatch(self.sync.receive(message, now, hold), now)
            return
        key = (m, message.fragment, message.base_version)
        before = self._senders.get(key)
        self._senders[key] = incarnation  # who sent it, for the ledger when it is merged
        actions = self.sync.receive(message, now, hold)
        if any(isinstance(a, Rejected) and a.learner == m and a.fragment == message.fragment for a in actions):
            # refused (a duplicate, stale work): the round keeps crediting whoever it admitted
            if before is None:
                self._senders.pop(key, None)
            else:
                self._senders[key] = before
        self._dispatch(actions, now)

    def _stale_poll(self, now: float) -> bool:
        deadline = self.sync.next_deadline()
        if deadline is not None and deadline <= now:
            return False
        self._polls.discard(now)
        return True

    def _on_poll(self, now: float) -> None:
        self._polls.discard(now)
        self._dispatch(self.sync.poll(now), now)

    def _dispatch(self, actions: list, now: float) -> None:
        """Carry the synchronizer's actions out over the simulated links.

        The update that follows a merge leaves after the merge's compute time; join updates and
        re-sends to a learner that sent stale work leave at once.
        """
        link = self.config.link
        merge_delay = 0.0
        for action in actions:
            if isinstance(action, Merged):
                self._account(action, now)
                numel = self.plan.sizes[action.fragment]
                merge_delay = link.merge(numel, len(action.admitted))
                sync_time = merge_delay + link.transfer(numel * self.config.wire_bytes_per_param)
                self.sync.observe_sync_time(sync_time)
            elif isinstance(action, FragmentUpdate):
                size = self.plan.sizes[action.fragment] * self.config.wire_bytes_per_param
                delay = merge_delay + link.transfer(size)
                for m in action.learners:
                    self._to_learner(m, now + delay, action)
                merge_delay = 0.0
            elif isinstance(action, FragmentRequest):
                for m in action.learners:
                    self._to_learner(m, now + link.latency, action)
            elif isinstance(action, Rejected):
                self.observe(
                    "rejected",
                    now,
                    {
                        "learner": action.learner,
                        "fragment": action.fragment,
                        "code": action.code.value,
                        "reason": action.reason,
                    },
                )
                self.rejected += 1
                if len(self.rejections) < 50:
                    self.rejections.append(f"t={now:.2f} learner {action.learner}: {action.reason}")
        deadline = self.sync.next_deadline()
        if deadline is not None and deadline not in self._polls:
            self._polls.add(deadline)
            self.queue.push(max(deadline, now), ("poll",))

    def _to_learner(self, m: int, when: float, message: object) -> None:
        learner = self.learners[m]
        self.queue.push(when, ("at_learner", m, learner.incarnation, message))

    def _account(self, merged: Merged, now: float) -> None:
        self.observe(
            "merge",
            now,
            {
                "fragment": merged.fragment,
                "version": merged.version,
                "learners": [w.learner for w in merged.admitted],
                "expected": merged.expected,
                "quorum_seconds": merged.quorum_time,
                "grace_seconds": merged.grace,
            },
        )
        self.merges += 1
        self.contributions += len(merged.admitted)
        if merged.contribution_norm > 0:
            self.norm_ratios.append(merged.merged_norm / merged.contribution_norm)
        self.longest_gap = max(self.longest_gap, now - self._last_merge_time)
        self._last_merge_time = now
        share = self.plan.share(merged.fragment)
        for work in merged.admitted:
            base = work.base_version if work.base_version >= 0 else merged.version - 1
            incarnation = self._senders.pop((work.learner, merged.fragment, base))
            self.ledger.reached_model(work.learner, incarnation, work.step, work.steps, share)
