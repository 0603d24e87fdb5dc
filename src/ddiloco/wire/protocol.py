"""What the messages mean: model signatures, the plan on the wire, and what a learner does when its
contribution is rejected (by the refusal's code; `headers` holds the contribution's and the reply's
fields).

Message kinds (all JSON heads, see `wire`): register / heartbeat / decline / leave / status / stop on
the control plane; contribution (learner -> synchronizer, Push), update, request and stop
(synchronizer -> learner, Subscribe) and fetch on the bulk plane. Peer recovery of the inner state:
donor (ask / poll, control), inner_state (donor -> synchronizer, Donate; synchronizer -> joiner,
Recover).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Mapping
from typing import Any

import torch

from ..core import FragmentPlan, RejectCode

#: What a learner does after a rejected contribution.
#:   none        an update is on its way anyway (stale work, or a duplicate of work already in a round)
#:   retry       nothing was merged: keep the work and send it again (with what it trains meanwhile)
#:   reregister  the synchronizer does not know this session: register again, then retry
#:   reset       the work itself is bad (NaN, wrong shape...): overwrite the fragment with the global
#:               value the synchronizer sends along; the work is counted as lost
ACTIONS = ("none", "retry", "reregister", "reset")

#: The action for each refusal's code: both sides read it (the synchronizer to log and to send the
#: global value along, the learner to act), and only ever by the code, never by the refusal's text.
#: "retry" is for calls refused before any reply (`learner.outbound`: a permanent gRPC error).
REJECTION_ACTIONS: dict[RejectCode, str] = {
    RejectCode.STALE: "none",
    RejectCode.DUPLICATE: "none",
    RejectCode.UNKNOWN_LEARNER: "reregister",
    RejectCode.UNKNOWN_SESSION: "reregister",
    RejectCode.NOT_OWNED: "reset",
    RejectCode.UNKNOWN_VERSION: "reset",
    RejectCode.BAD_COUNTERS: "reset",
    RejectCode.BAD_TENSORS: "reset",
    RejectCode.NON_FINITE: "reset",
    RejectCode.TOO_LARGE: "reset",
    RejectCode.MERGE_REFUSED: "reset",
    RejectCode.MALFORMED: "reset",
}


def rejection_action(code: RejectCode | None) -> str:
    """What a refusal with `code` asks of the learner; a refusal without a code it knows resets."""
    return "reset" if code is None else REJECTION_ACTIONS[code]


def signature(shapes: Mapping[str, torch.Tensor | Iterable[int]]) -> str:
    """Digest of the model's parameter names and shapes, independent of their order."""
    items = sorted((name, list(v.shape) if isinstance(v, torch.Tensor) else list(v)) for name, v in shapes.items())
    return hashlib.sha256(json.dumps(items).encode()).hexdigest()[:16]


def plan_to_json(plan: FragmentPlan, shapes: Mapping[str, torch.Tensor]) -> dict[str, Any]:
    return {
        "names": [list(names) for names in plan.names],
        "sizes": list(plan.sizes),
        "shapes": {n: list(shapes[n].shape) for names in plan.names for n in names},
    }


def plan_from_json(d: Mapping[str, Any]) -> tuple[FragmentPlan, dict[str, tuple[int, ...]]]:
    plan = FragmentPlan(names=tuple(tuple(n) for n in d["names"]), sizes=tuple(int(s) for s in d["sizes"]))
    return plan, {n: tuple(s) for n, s in d["shapes"].items()}


def state_checksum(tensors: Mapping[str, torch.Tensor], scalars: Mapping[str, Mapping[str, float]]) -> str:
    """SHA-256 of an optimizer-state donation: every tensor's fp32 bytes in name order, then the
    scalars as sorted JSON. The donor computes it on what it snapshotted, the joiner on what it
    received: equal digests mean the joiner holds exactly the donor's moments."""
    h = hashlib.sha256()
    for name in sorted(tensors):
        h.update(name.encode())
        h.update(tensors[name].detach().to("cpu", torch.float32).contiguous().numpy().tobytes())
    h.update(json.dumps({k: dict(sorted(v.items())) for k, v in sorted(scalars.items())}).encode())
    return h.hexdigest()
