"""Work already taken from each learner, so that none is merged twice.

A learner's contribution to fragment p is its outer gradient since it last received p: everything it
trained on p since that base version. A second snapshot on the same base version therefore holds the
first one's work as well. A learner sends one only after `LearnerCore.retry` (its connection was
replaced, or a push failed and the synchronizer may have lost it). If the synchronizer did take the
first (an open round, a carry, a merge in progress or done), taking the second too would count the
first's steps twice, and with late work merged (`late`) nothing else would stop it.

So, per (learner, fragment), the synchronizer remembers the base version and learner step of the
newest snapshot it took, and refuses:
- a snapshot at or before that step (the same push sent again, or an older one arriving late);
- a later snapshot on the same base version (it repeats the taken one's steps).
A refused merge gives its contributors' records back (their work was not taken). A learner's new life
(a restarted process) and a synchronizer restart start the records anew.
"""

from __future__ import annotations

from dataclasses import dataclass

from .messages import Contribution, Refusal, RejectCode


@dataclass(frozen=True)
class TakenSnapshot:
    base_version: int
    step: int


class TakenWork:
    """Per (learner, fragment): the newest snapshot taken into a round, a carry or a merge."""

    def __init__(self) -> None:
        self.newest: dict[tuple[int, int], TakenSnapshot] = {}

    def refusal(self, c: Contribution) -> Refusal | None:
        """Why `c` must not be taken (its work, or part of it, is taken already), or None."""
        taken = self.newest.get((c.learner, c.fragment))
        if taken is None:
            return None
        if c.step <= taken.step:
            return Refusal(
                RejectCode.DUPLICATE,
                f"duplicate: the snapshot at step {c.step} was taken already (newest taken: step {taken.step})",
            )
        if c.base_version == taken.base_version:
            return Refusal(
                RejectCode.DUPLICATE,
                f"duplicate: the snapshot at step {taken.step} on the same version {taken.base_version} was "
                f"taken already; this one (step {c.step}) repeats its steps",
            )
        return None

    def take(self, c: Contribution) -> None:
        key = (c.learner, c.fragment)
        taken = self.newest.get(key)
        if taken is None or c.step > taken.step:
            self.newest[key] = TakenSnapshot(c.base_version, c.step)

    def give_back(self, c: Contribution) -> None:
        """`c`'s work was not merged after all (a refused merge): the learner may send it again."""
        key = (c.learner, c.fragment)
        if self.newest.get(key) == TakenSnapshot(c.base_version, c.step):
            del self.newest[key]

    def new_life(self, learner: int) -> None:
        """A restarted learner process counts its steps anew."""
        for key in [k for k in self.newest if k[0] == learner]:
            del self.newest[key]

    def clear(self) -> None:
        self.newest.clear()
