"""The run's end when the learners end it themselves: no budget, no Stop, each learner finishes its loop.

A learner says that its training loop is over with its final work, or by leaving for good; the driver
tells the core (`SynchronizerCore.finishing`). The end then follows the rules of a budget's end
(`begin_final_flush`), so that a run ends alike however it comes:

- once no live learner is still training (and one has finished), the final flush begins: its rounds
  gather everyone's last work and merge it without outer momentum (`final_momentum`);
- a round that holds a finished learner's work merges without momentum, even while others still
  train: that work is a tail of a few steps, and the momentum built over the run would move such a
  fragment by far more than the work itself (docs/algorithm.md, "The end of a run").

A learner that comes back (a new process, or a learner that had not finished reconnecting) ends a
flush the learners began: the run goes on. A flush that a budget or a Stop began never ends.
Nothing here reads a clock: `window` is the driver's, in the unit of its `now`.
"""

from __future__ import annotations

from collections.abc import Iterable, Set


class LearnersEnd:
    """Which learners have finished their loops, and whether the flush under way is theirs."""

    def __init__(self) -> None:
        self.finished: set[int] = set()
        self.began = False  # the final flush under way was begun by the learners (a joiner ends it)
        self.window: float | None = None  # how long their flush may gather (the driver's drain share); None: no bound

    def finish(self, learner: int) -> None:
        self.finished.add(learner)

    def over(self, live: Set[int]) -> bool:
        """No live learner is still training, and one has finished (a run whose learners all failed
        or have not joined yet has not ended)."""
        return bool(self.finished) and live <= self.finished

    def joined(self, learner: int, restarted: bool) -> bool:
        """A learner (re)joins; True when the flush the learners began must end (the run goes on).
        A new process trains anew; the same process reconnecting keeps its finished mark."""
        if restarted:
            self.finished.discard(learner)
        if self.began and learner not in self.finished:
            self.began = False
            return True
        return False

    def tail(self, learners: Iterable[int]) -> bool:
        """Whether work of these learners includes a finished learner's last work."""
        return any(m in self.finished for m in learners)
