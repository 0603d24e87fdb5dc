"""When a run is over: a token budget, a duration, both (whichever comes first) or neither.

Progress in [0, 1] drives the learners' learning-rate schedules, so it is the larger of the two
fractions: a run that ends by time decays its learning rate by time.
"""

from __future__ import annotations


class RunBudget:
    def __init__(self, tokens: int | None, duration: float | None, started_wall: float) -> None:
        self.tokens = tokens
        self.duration = duration
        self.started_wall = started_wall

    def progress(self, tokens_reported: float, now_wall: float) -> float:
        fractions = [0.0]
        if self.tokens:
            fractions.append(tokens_reported / self.tokens)
        if self.duration:
            fractions.append((now_wall - self.started_wall) / self.duration)
        return min(1.0, max(fractions))

    def exhausted(self, tokens_reported: float, now_wall: float) -> str | None:
        """Why the run is over, or None while it is not."""
        if self.tokens and tokens_reported >= self.tokens:
            return f"token budget of {self.tokens} reached"
        if self.duration and now_wall - self.started_wall >= self.duration:
            return f"duration of {self.duration:g} s reached"
        return None
