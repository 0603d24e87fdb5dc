"""Peer recovery of the inner optimizer state, the learner's side (the synchronizer's is `donations`).

A learner that joins with an empty optimizer (a new machine: nothing saved, nothing to load) asks
the synchronizer for a donor, waits for the donor's upload and loads it: the AdamW moments and step
of a live learner, so it does not restart its inner optimizer cold. The state is checked against
its checksum; a donor that dies mid-transfer fails the attempt, and the joiner asks again (another
donor) or starts cold and says so. Parameters never move this way.

A donor snapshots its optimizer in the training thread at a step boundary (a copy, so training goes
on at once) and uploads it from a background thread.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, cast

import grpc
import torch

from ..wire import framing, reassembly
from ..wire.protocol import state_checksum
from .fanout import is_sharded

if TYPE_CHECKING:
    from torch.distributed.tensor import DTensor

log = logging.getLogger(__name__)
ATTEMPTS = 3


def snapshot(
    optimizer: torch.optim.Optimizer,
    params: Mapping[str, torch.Tensor],
) -> tuple[dict[str, torch.Tensor], dict[str, dict[str, float]]]:
    """The optimizer's per-parameter state by parameter name: tensors shaped like the parameter (the
    moments) as full fp32 host copies, one-element tensors and numbers (the step) as scalars.
    Collective when the state is sharded (FSDP2): every rank calls it, in the same order of
    parameters, and each gets the whole state."""
    tensors: dict[str, torch.Tensor] = {}
    scalars: dict[str, dict[str, float]] = {}
    for name, p in params.items():
        state = optimizer.state.get(p)
        if not state:
            continue
        for key in sorted(state):
            value = state[key]
            if torch.is_tensor(value) and value.shape == p.shape and key != "step":
                full = cast("DTensor", value.detach()).full_tensor() if is_sharded(value) else value.detach()
                tensors[f"{name}/{key}"] = full.to("cpu", torch.float32, copy=True)
            elif (
                torch.is_tensor(value)
                and value.numel() == 1
                or isinstance(value, (int, float))
                and not isinstance(value, bool)
            ):
                scalars.setdefault(name, {})[key] = float(value)
    return tensors, scalars


def load(
    optimizer: torch.optim.Optimizer,
    params: Mapping[str, torch.Tensor],
    tensors: Mapping[str, torch.Tensor],
    scalars: Mapping[str, Mapping[str, float]],
) -> int:
    """Install a donated state into `optimizer` (its hyperparameters stay its own); returns the step."""
    on_device = any(g.get("fused") or g.get("capturable") for g in optimizer.param_groups)
    for full, value in tensors.items():
        name, _, key = full.rpartition("/")
        p = params[name]
        if is_sharded(value):  # this rank's shard, already laid out like the parameter (`share_state`)
            optimizer.state[p][key] = value if value.dtype == p.dtype else value.to(dtype=p.dtype)
        else:
            optimizer.state[p][key] = value.to(p.device, p.dtype, copy=True)
    for name, values in scalars.items():
        p = params[name]
        for key, v in values.items():
            optimizer.state[p][key] = torch.tensor(v, dtype=torch.float32, device=p.device if on_device else "cpu")
    return int(max((v.get("step", 0.0) for v in scalars.values()), default=0.0))


def upload(link, ticket: str, tensors: dict[str, torch.Tensor], scalars: dict) -> None:  # noqa: ANN001
    """Send a snapshot for `ticket` (in a background thread); failures are logged, never raised."""
    sid = link.session
    if sid is None:
        return
    head = {
        "kind": "inner_state",
        "session": sid,
        "ticket": ticket,
        "scalars": scalars,
        "checksum": state_checksum(tensors, scalars),
    }
    frames = framing.tensor_frames(head, tensors, "fp32", link.chunk_bytes)
    nbytes = sum(len(f) for f in frames)

    def paced():
        for frame in link.ctx.wan.paced_up(frames):
            if link.ctx.net_delay:  # chaos testing: a slow link, per frame
                time.sleep(link.ctx.net_delay)
            yield frame

    try:
        link.ctx.wan.delay()
        link.bulk.donate(
            paced(),
            timeout=link.timeouts.bulk(nbytes)
            + len(frames) * link.ctx.net_delay
            + link.ctx.wan.transfer_seconds(nbytes),
            metadata=link.bulk.metadata,
        )
        log.info(
            "donated the inner state (%d tensors, %.1f MB, checksum %s) for ticket %s",
            len(tensors),
            nbytes / 1e6,
            head["checksum"],
            ticket,
        )
    except grpc.RpcError as exc:
        log.warning("donation for ticket %s failed (%s: %s)", ticket, exc.code().name, exc.details())


def start_upload(
    link,
    ticket: str,
    tensors: dict[str, torch.Tensor],
    scalars: dict,  # noqa: ANN001
) -> threading.Thread:
    """Upload a `snapshot` in a background thread, so training goes on at once."""
    t = threading.Thread(target=upload, args=(link, ticket, tensors, scalars), name="ddiloco-donate", daemon=True)
    t.start()
    return t


def donate_gathered(
    optimizer: torch.optim.Optimizer, params: Mapping[str, torch.Tensor], links: list, tickets: list[tuple[int, str]]
) -> None:
    """A sharded learner's donation at a step boundary: every rank gathers (collective), rank 0
    (the one holding `tickets`: (link index, ticket)) uploads."""
    state = snapshot(optimizer, params)
    for link, ticket in tickets:
        start_upload(links[link], ticket, *state)


@dataclass
class Recovered:
    """A donated state that arrived intact, not yet loaded."""

    donor: int
    step: int
    checksum: str
    attempts: int
    tensors: dict[str, torch.Tensor] = field(repr=False)
    scalars: dict[str, dict[str, float]] = field(repr=False)

    def info(self) -> dict:
        return {"donor": self.donor, "step": self.step, "checksum": self.checksum, "attempts": self.attempts}


def recover(link, params: Mapping[str, torch.Tensor], learner: int) -> Recovered | None:  # noqa: ANN001
    """Ask for donors until one's state arrives intact (at most ATTEMPTS); None: start cold (logged).
    The caller loads it (`load`, or `share_state` in a multi-rank learner)."""
    t = link.timeouts
    model_bytes = sum(p.numel() * 4 for p in params.values())
    for attempt in range(1, ATTEMPTS + 1):
        sid = link.session
        reply = _control(link, {"session": sid, "op": "ask"})
        if not reply or not reply.get("ok"):
            reason = (reply or {}).get("reason", "the synchronizer did not answer")
            # the first learners of a run have nobody to ask: that is normal, not a warning
            level = logging.INFO if attempt == 1 and reply is not None else logging.WARNING
            log.log(level, "learner %d starts its inner optimizer cold: %s", learner, reason)
            return None
        ticket, donor = reply["ticket"], reply["donor"]
        deadline = time.monotonic() + t.drain + t.bulk(3 * model_bytes)
        state, polled = "asked", {}
        while time.monotonic() < deadline and state in ("asked", "uploading"):
            time.sleep(min(0.25, t.heartbeat))
            polled = _control(link, {"session": sid, "op": "poll", "ticket": ticket}) or {}
            state = polled.get("state", state)
        if state == "ready":
            got = _download(link, sid, ticket, params)
            if got is not None:
                tensors, scalars, checksum = got
                step = int(max((v.get("step", 0.0) for v in scalars.values()), default=0.0))
                log.info(
                    "learner %d took its inner state from learner %d (step %d, checksum %s)",
                    learner,
                    donor,
                    step,
                    checksum,
                )
                return Recovered(donor, step, checksum, attempt, tensors, scalars)
        else:
            log.warning(
                "learner %d: inner state from learner %d did not arrive (%s)%s",
                learner,
                donor,
                polled.get("reason") or state,
                "; asking another" if attempt < ATTEMPTS else "",
            )
    log.warning("learner %d starts its inner optimizer cold: %d donations failed", learner, ATTEMPTS)
    return None


def share_state(
    fanout,
    optimizer: torch.optim.Optimizer | None,  # noqa: ANN001
    params: Mapping[str, torch.Tensor],
    given: Recovered | None,
) -> None:
    """Rank 0's recovered state (`given`) onto every rank of a multi-rank learner, which each load
    it: replicated parameters get the whole tensor (broadcast), sharded ones (FSDP2) their own shard
    (`distribute_tensor`). The layout travels as JSON first. Collective: every rank calls it."""
    layout = None
    if fanout.is_leader and given is not None:
        layout = {"tensors": sorted(given.tensors), "scalars": given.scalars}
    layout = json.loads(fanout.share_bytes(json.dumps(layout).encode() if fanout.is_leader else None))
    if not layout:
        return
    received = {}
    for full in layout["tensors"]:
        name = full.rpartition("/")[0]
        shape = params[name].shape
        # rank 0 shared a layout, so it was given one
        value = cast(Recovered, given).tensors[full] if fanout.is_leader else torch.empty(shape, dtype=torch.float32)
        if name in fanout.sharded:
            received[full] = fanout.scatter(name, value)
        else:
            received[full] = fanout.broadcast(value)
    if optimizer is not None:
        load(optimizer, params, received, layout["scalars"])


def _control(link, head: dict) -> dict | None:  # noqa: ANN001
    try:
        return framing.read_message(link.control.call("Donor", framing.message(head), link.timeouts.rpc))
    except grpc.RpcError as exc:
        log.info("Donor call failed (%s)", exc.code().name)
        return None


def _download(
    link,
    sid: str,
    ticket: str,
    params: Mapping[str, torch.Tensor],  # noqa: ANN001
) -> tuple[dict, dict, str] | None:
    try:
        frames = link.bulk.recover(
            framing.message({"session": sid, "ticket": ticket}),
            timeout=link.timeouts.bulk(4 * sum(p.numel() * 4 for p in params.values())),
            metadata=link.bulk.metadata,
        )
        msg = next(reassembly.read_stream(frames, 1 << 40))
        expected = {
            s.name: tuple(params[s.name.rpartition("/")[0]].shape)
            for s in msg.specs()
            if s.name.rpartition("/")[0] in params
        }
        tensors = msg.tensors(expected)
        scalars = {
            n: {k: float(v) for k, v in vals.items()} for n, vals in msg.head.get("scalars", {}).items() if n in params
        }
    except (grpc.RpcError, framing.WireError, StopIteration, ValueError, KeyError, TypeError) as exc:
        log.warning("download of the donated inner state failed: %s", exc)
        return None
    checksum = state_checksum(tensors, scalars)
    if checksum != msg.head.get("checksum"):
        log.warning("the donated inner state does not match its checksum: not used")
        return None
    return tensors, scalars, checksum
