"""The two things the networked learner needs from `LearnerCore` that the core has no method for yet.

Both are proposed as core methods (see docs/runtime.md, "Core changes we recommend"); until then they
live here, in one place, so the net layer never pokes the core anywhere else.

* `force_update`: overwrite a fragment with the global value even when the learner already holds
  that version (or a newer one). Needed after a rejected contribution (the local fragment may hold
  NaN) and after a synchronizer restarted from a checkpoint older than what the learner holds.
  `LearnerCore.receive` ignores such updates on purpose, so it cannot be used.
* `retry`: forget that a contribution is in flight (it was refused or lost with a crashed
  synchronizer) and make the fragment due now, so the work is sent again with what was trained
  since. Without it the learner waits for an update that never comes and never sends that fragment
  again (or, with blocking syncs, waits forever).
"""

from __future__ import annotations

from ..core import FragmentUpdate, LearnerCore


def force_update(core: LearnerCore, update: FragmentUpdate) -> None:
    """Apply `update` at the next step boundary whatever version the learner holds."""
    core.inbox[update.fragment] = update


def retry(core: LearnerCore, fragment: int, version: int) -> bool:
    """If the contribution against `version` is still awaited, drop it and make the fragment due now."""
    if core.pending[fragment] != version:
        return False
    core.pending[fragment] = None
    core.anchors[fragment] = core.step - core.schedule.period
    return True
