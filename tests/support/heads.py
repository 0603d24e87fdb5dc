"""What the synchronizer tests send and check by hand: a contribution's head and a digest of the
global parameters (a refused input must leave it unchanged)."""

from __future__ import annotations

import hashlib


def contribution_head(session: str, version: int, fragment: int = 0) -> dict:
    """The head of a 4-step, 64-token contribution against `version`, as a learner sends it."""
    return {
        "kind": "contribution",
        "session": session,
        "fragment": fragment,
        "base_version": version,
        "steps": 4,
        "tokens": 64,
        "seconds": 0.1,
        "step_time": 0.025,
        "step": 4 * (version + 1),
        "position": 4 * (version + 1),
    }


def params_digest(service) -> str:  # noqa: ANN001 - a SynchronizerService
    """SHA-256 of the service's global parameters, read under its lock."""
    h = hashlib.sha256()
    with service.lock:
        for name in sorted(service.core.params):
            h.update(service.core.params[name].numpy().tobytes())
    return h.hexdigest()
