"""Token weights: quantity (tokens since the learner last received the fragment) times quality
(tokens per step, i.e. batch size), so a learner that did more work, with bigger batches, counts more."""

from __future__ import annotations


def token_weight(tokens: float, steps: int) -> float:
    """w = c_tokens^2 / c_steps; zero for a learner that has not stepped since it received the fragment."""
    if steps < 0 or tokens < 0:
        raise ValueError(f"steps and tokens must be >= 0, got steps={steps}, tokens={tokens}")
    if steps == 0:
        return 0.0
    return float(tokens) * float(tokens) / float(steps)
