"""Token grants: how far each learner may train, so that a run stops at its token budget.

A learner reports its tokens with its heartbeats, and the synchronizer sees the budget reached only
after the reports and the stop have crossed the link: learners whose steps are shorter than a
heartbeat would train tens of steps past the budget. Instead the
synchronizer grants each learner a count it may train up to (`allowed`, in its replies), and the
learner takes no step once its count has reached it. Grants never add up past the budget:

    free = budget - (tokens reported by everyone) - (granted but not yet reported, over live learners)

and each heartbeat tops the learner's lead (granted less reported) up to a few heartbeats of its own
training (`LEAD_HEARTBEATS`), or once the tokens run short up to a share of them as its whole lead:
one live learner's in as many as are live, at most a quarter (`SHARE_WAYS`), so that a fast learner
alone at the start cannot take, heartbeat by heartbeat, what learners still starting need. So the
tokens trained are at most the budget plus one step per learner (the step that crosses the grant),
plus the first step of each learner process, which it takes before it has a grant (its step's size
is not known before). A learner no longer live (left, declared gone, replaced) returns its lead.

Pure: no clock, no I/O; the service calls it under its lock with the ledger's counts.
"""

from __future__ import annotations

import math
from collections.abc import Collection

LEAD_HEARTBEATS = 3.0  # a learner's grant runs this many heartbeats ahead of its reports
SHARE_WAYS = 4  # at most this share of the free tokens to one learner at a time while they run short


class TokenGrants:
    def __init__(self, budget: int | None) -> None:
        self.budget = budget
        self.granted: dict[str, int] = {}  # live incarnation -> cumulative tokens it may train
        self.reported: dict[str, int] = {}  # live incarnation -> its count at its last grant

    def lead(self) -> int:
        """Tokens granted to live learners and not yet reported: reserved, not free."""
        return sum(max(0, g - self.reported.get(i, 0)) for i, g in self.granted.items())

    def grant(
        self,
        incarnation: str,
        tokens: int,
        total_reported: int,
        steps: int,
        step_seconds: float,
        heartbeat: float,
        live: Collection[str],
    ) -> int | None:
        """The count this learner may train up to, after its report of `tokens` (its own count,
        `steps` steps, `step_seconds` each); `total_reported`: every learner's reported tokens,
        this report included; `live`: the incarnations of the live sessions (the others' leads are
        free again). None: no token budget, nothing to grant."""
        if not self.budget:
            return None
        for gone in [i for i in self.granted if i not in live and i != incarnation]:
            self.release(gone)
        self.reported[incarnation] = max(tokens, self.reported.get(incarnation, 0))
        granted = max(self.granted.get(incarnation, 0), tokens)
        if steps <= 0:  # its step's size is unknown: no lead yet (its first step needs none)
            self.granted[incarnation] = granted
            return granted
        step_tokens = tokens / steps
        ahead = max(1.0, math.ceil(LEAD_HEARTBEATS * heartbeat / max(step_seconds, 1e-6)))
        target = int(step_tokens * ahead)  # the lead it would like: a few heartbeats of its steps
        own = granted - tokens  # its lead now
        others = self.lead() - max(0, self.granted.get(incarnation, 0) - self.reported[incarnation])
        pool = max(0, self.budget - total_reported - others)  # what it may lead by at most: its lead and the free
        sharing = max(SHARE_WAYS, len(live))  # some left for learners that have not registered yet
        # Plenty: the whole target. Short: a share of the pool as its whole lead (not a share of what is
        # left at each heartbeat, which a fast learner's heartbeats would take bit by bit); the last few
        # tokens to whoever asks.
        lead = target if pool >= target * sharing else (pool // sharing or pool)
        granted += max(0, min(lead, pool) - own)
        self.granted[incarnation] = granted
        return granted

    def release(self, incarnation: str) -> None:
        """The learner is gone (left, declared failed, replaced): its unreported lead is free again."""
        self.granted.pop(incarnation, None)
        self.reported.pop(incarnation, None)

    def allowed(self, incarnation: str) -> int | None:
        """The learner's current grant (its registration's reply), None without a token budget."""
        if not self.budget:
            return None
        return self.granted.get(incarnation, self.reported.get(incarnation, 0))
