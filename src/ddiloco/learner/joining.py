"""Joining a run: the shards' registration replies checked against each other and the model, then
the global value of every fragment awaited before the first step."""

from __future__ import annotations

import logging
import queue
import time
from collections.abc import Mapping, Sequence

import torch

from ..core import (
    AlgorithmConfig,
    FragmentPlan,
    FragmentRequest,
    FragmentUpdate,
    LearnerCore,
    Schedule,
)
from ..wire.protocol import plan_from_json
from ..wire.routing import check_cover
from .fanout import RankFanout
from .initial import InitialValues
from .link import LinkContext, ShardLink, SynchronizerError
from .staging import SnapshotStager

log = logging.getLogger(__name__)


def check_replies(
    addresses: Sequence[str],
    replies: Sequence[dict],
    params: Mapping[str, torch.Tensor],
) -> tuple[FragmentPlan, AlgorithmConfig, dict[int, int]]:
    """The plan and algorithm every shard agrees on, and which shard owns each fragment."""
    first = replies[0]
    for address, reply in zip(addresses[1:], replies[1:], strict=True):
        if reply["plan"] != first["plan"] or reply["algorithm"] != first["algorithm"]:
            raise SynchronizerError(f"synchronizer {address} runs a different plan or algorithm than {addresses[0]}")
    plan, shapes = plan_from_json(first["plan"])
    config = AlgorithmConfig(**first["algorithm"])
    check_cover({i: r["owned"] for i, r in enumerate(replies)}, plan.num_fragments)
    owner = {p: i for i, r in enumerate(replies) for p in r["owned"]}
    for name, shape in shapes.items():
        if name not in params or tuple(params[name].shape) != shape:
            raise SynchronizerError(f"model parameter {name!r} does not match the synchronizer's shape {shape}")
    return plan, config, owner


def register_fresh(
    links: Sequence[ShardLink],
    ctx: LinkContext,
    params: Mapping[str, torch.Tensor],
    fanout: RankFanout | None,
    deadline: float,
) -> list[dict]:
    """Register with every shard, offering the digests of our values, so that a fragment that we built
    exactly as the synchronizer did is not downloaded (not under FSDP: its ranks hold shards)."""
    ctx.initial = InitialValues(params) if not (fanout and fanout.sharded) else None
    return [link.register(fresh=True, deadline=deadline) for link in links]


def await_global(
    inbound: queue.Queue,
    num_fragments: int,
    deadline: float,
) -> tuple[list[FragmentUpdate], list[FragmentRequest]]:
    """The newest global value of every fragment (and requests that came meanwhile), by `deadline`."""
    updates: dict[int, FragmentUpdate] = {}
    requests: list[FragmentRequest] = []
    while len(updates) < num_fragments:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise ConnectionError(
                f"timed out waiting for the global parameters ({len(updates)} of {num_fragments} fragments arrived)"
            )
        try:
            event = inbound.get(timeout=min(remaining, 1.0))
        except queue.Empty:
            continue
        if event[0] == "update":
            u = event[2]
            if u.fragment not in updates or u.version > updates[u.fragment].version:
                updates[u.fragment] = u
        elif event[0] == "request":
            requests.append(event[2])
        elif event[0] == "fatal":
            raise SynchronizerError(event[2])
    return list(updates.values()), requests


def make_core(
    learner: int,
    held: Mapping[str, torch.Tensor],
    plan: FragmentPlan,
    config: AlgorithmConfig,
    sharded: bool,
    base_device: str = "cpu",
) -> LearnerCore:
    """The algorithm's learner side, as the run's config says (`sharded`: an FSDP learner). With the
    base copy on the host (the default) snapshots go through reused host buffers (`staging`)."""
    rebase = config.rebases
    if rebase and sharded:  # rank 0's copy of a fragment is current only when it is snapshotted
        log.warning(
            "arrival 'rebase' is not supported with FSDP-sharded learners yet: this learner overwrites its "
            "fragments when a global value arrives (the steps since the snapshot are lost)"
        )
        rebase = False
    schedule = Schedule(config.fragments, config.sync_every, config.overlap)
    stage = SnapshotStager(held).stage if torch.device(base_device).type == "cpu" else None
    return LearnerCore(
        learner,
        held,
        plan,
        schedule,
        ema=config.ema,
        rebase=rebase,
        base_device=base_device,
        stage=stage,
        late_merged=config.late == "merge",
        synchronous=config.synchronous,
    )


def resync(
    core: LearnerCore,
    shard: int,
    versions: Mapping[int, int],
    force: dict[int, int],
    holding: Mapping[int, int] | None = None,
) -> None:
    """After registering again with a shard: resend what it lacks, take its value where it is older
    than ours (a synchronizer restored from an older checkpoint: `force` collects those versions).
    `holding`: fragment -> base version of our work the shard holds unmerged; that work is not sent
    again (the shard would refuse it as repeating work it took: core/taken.py), its merge comes."""
    for p, v in versions.items():
        held = core.versions[p]
        if v < held:
            log.warning(
                "synchronizer shard %d holds fragment %d at version %d, older than our %d: taking its value",
                shard,
                p,
                v,
                held,
            )
            force[p] = v
        elif v == held and (holding or {}).get(p) != core.pending[p]:
            core.retry(p, v)
