"""Online estimates of step and sync times, and the adaptive grace window built on them.

    slack = tau * step_time - link - (quorum_time + sync_time);  grace = gamma * max(0, slack)

Inside that window more learners are admitted without any learner ever waiting: the merged fragment
still reaches the learners within tau steps of the snapshot. What each term means here:

* step_time (xi_step): an EMA of the step times of the learners that *formed quorums*, the ones
  whose tau-step budget the window spends. Slower learners admitted during the grace window do not
  count: their longer steps would stretch the window past what the fast learners can hide.
* quorum_time (xi_quorum): this round's own time from opening to quorum, known exactly when the
  window opens, so it is used as measured rather than averaged.
* sync_time (xi_sync): an EMA of merge + outer step + send, measured by the driver.
* tau and link: the quorum-forming learners' own tau and measured link time (snapshot to update
  back, the wire's part), when they send them (`learner.overlap`); else the config's tau and 0.

**Time for a pull** (`cover_pulls`, on where in-flight steps are re-based, not overwritten). A round
opened by one learner pulls the fragment from the others; behind a link, their answer takes the
request's way there, up to a step to reach a step boundary, and their push: about the link time plus
`PULL_STEPS` steps. Eq. 3's window (tau_0 steps of slack once tau covers the link) is shorter than
that, so on a 100 ms link the pulled learners always missed the leader's round and their work was
merged one round later, a period stale, for the whole run: the lag a learner starts with never closed
(eval loss 2.65 against 2.53 on the emulated link, docs/results.md). So, behind a measured link, the
window is at least link + PULL_STEPS * xi_step. Nobody waits for it: the round still closes as soon as
every live learner has answered, and the leader's steps meanwhile are re-based, not lost.
"""

from __future__ import annotations

from dataclasses import dataclass, field

PULL_STEPS = 2  # a pulled learner's answer: up to a step to its boundary, and a step of margin


@dataclass
class Ema:
    """Exponential moving average; the first observation initialises it."""

    alpha: float
    value: float | None = None

    def update(self, x: float) -> float:
        if x < 0:
            raise ValueError(f"a duration cannot be negative, got {x}")
        self.value = x if self.value is None else (1 - self.alpha) * self.value + self.alpha * x
        return self.value

    def get(self, default: float = 0.0) -> float:
        return default if self.value is None else self.value


@dataclass
class GraceWindow:
    """Grace length for one round, from smoothed step and sync times and this round's quorum time."""

    overlap: int
    gamma: float
    alpha: float = 0.2
    cover_pulls: bool = False  # the window also covers a pulled learner's answer behind a link (above)
    step_time: Ema = field(init=False)
    sync_time: Ema = field(init=False)

    def __post_init__(self) -> None:
        self.step_time = Ema(self.alpha)
        self.sync_time = Ema(self.alpha)

    def slack(self, quorum_time: float, overlap: int | None = None, link: float = 0.0) -> float:
        """`overlap`: the round's tau where its learners chose their own (`--overlap auto`), else the
        config's; `link`: their link time, snapshot to update back less the merge, which the tau
        steps must also cover."""
        tau = self.overlap if overlap is None or overlap < 0 else overlap
        return tau * self.step_time.get() - link - (quorum_time + self.sync_time.get())

    def length(self, quorum_time: float, overlap: int | None = None, link: float = 0.0) -> float:
        """gamma * max(0, slack), and with `cover_pulls` behind a link at least the time a pulled
        learner needs to answer; zero until a step time has been observed, and with gamma 0."""
        if self.step_time.value is None:
            return 0.0
        window = self.gamma * max(0.0, self.slack(quorum_time, overlap, link))
        if self.cover_pulls and self.gamma > 0 and link > 0:
            window = max(window, link + PULL_STEPS * self.step_time.get())
        return window

    def state_dict(self) -> dict[str, float | None]:
        return {"step": self.step_time.value, "sync": self.sync_time.value}

    def load_state_dict(self, state: dict[str, float | None]) -> None:
        self.step_time.value = state.get("step")
        self.sync_time.value = state.get("sync")  # older checkpoints also hold "quorum": unused
