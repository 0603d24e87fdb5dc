"""What the synchronizer says about itself: its status (for the launcher and the live view) and why a
round has not formed its quorum yet (for the logs). Read-only views of the service's state."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterable, Iterator
from typing import Protocol

from ..core import SynchronizerCore
from .donations import DonationDesk
from .ledger import MergeLedger
from .sessions import SessionTable
from .settings import ServiceSettings
from .traffic import Traffic


class ServiceView(Protocol):
    """What the status reads of the service (so that this module need not import it)."""

    core: SynchronizerCore
    ledger: MergeLedger
    settings: ServiceSettings
    sessions: SessionTable
    refused_rpcs: int
    stopping: bool
    stop_wall: float | None
    finished: threading.Event
    restored_from: int | None
    donations: DonationDesk
    traffic: Traffic

    @property
    def recent_rejections(self) -> Iterable[str]: ...
    def progress(self) -> float: ...


def waiting_rounds(core: SynchronizerCore, now: float, after: float) -> Iterator[tuple[int, int, str]]:
    """(fragment, version, reason) for every round that has waited `after` seconds without a quorum."""
    for r in core.open_rounds():
        if r.quorum_at is None and now - r.opened_at >= after:
            yield r.fragment, r.version, r.describe(now)


def status(service: ServiceView) -> dict:
    """The service's state as JSON (the caller holds its lock)."""
    core, ledger = service.core, service.ledger
    return {
        "shard": service.settings.shard,
        "num_shards": service.settings.num_shards,
        "versions": {str(p): v for p, v in core.versions.items()},
        "version_sum": sum(core.versions.values()),
        "merges": ledger.merges,
        "contributions": ledger.contributions,
        "rejected_contributions": ledger.rejected,
        "rejections": list(service.recent_rejections),
        "refused_calls": service.refused_rpcs,
        "tokens_reported": ledger.tokens_reported,
        "tokens_merged": ledger.tokens_merged,
        "tokens_refused": ledger.tokens_refused,
        "useful_seconds": ledger.useful_seconds,
        "double_merged_steps": ledger.double_merged_steps,
        "started_wall": ledger.started_wall,
        "first_join_wall": ledger.first_join_wall,
        "last_merge_wall": ledger.last_merge_wall,
        "stall_seconds_max": ledger.stall(time.time()),
        "live": sorted(core.live),
        "learners": {
            str(m): {
                **s.progress,
                "incarnation": s.incarnation,
                "seconds_since_heartbeat": time.monotonic() - s.last_seen,
                "tokens_merged": ledger.book(m).tokens_merged,
                "contributions": ledger.book(m).contributions,
                "last_merge_wall": ledger.book(m).last_merge_wall,
                "merged_position": ledger.book(m).merged_position,
            }
            for m, s in service.sessions.by_learner.items()
        },
        "books": {
            str(m): {
                "tokens_trained": b.tokens_trained,
                "tokens_merged": b.tokens_merged,
                "merged_position": b.merged_position,
                "contributions": b.contributions,
                "rejected": b.rejected,
            }
            for m, b in ledger.books.items()
        },
        "open_rounds": len(core.open_rounds()),
        "params": sum(core.plan.sizes[p] for p in core.owned),
        "bytes_received": service.traffic.bytes_received,  # contributions (bulk frames)
        "bytes_sent": service.traffic.bytes_sent,  # updates streamed to learners
        "updates_sent": dict(service.traffic.updates),  # by form: {"difference": n, "whole": n}
        "update_bytes_sent": dict(service.traffic.update_bytes),  # their frames' bytes, by form
        "difference_whole_bytes": service.traffic.difference_whole_bytes,  # the differences' bf16 whole payload
        # the bulk socket plane: connections closed and calls refused by reason (hello_timeout,
        # per_address_cap, total_cap, bad_token, ...), and those waiting unauthenticated now
        "bulk": {"closed": service.traffic.closed_counts(), "waiting": service.traffic.bulk_waiting},
        "stopping": service.stopping,
        "stop_wall": service.stop_wall,
        "finished": service.finished.is_set(),
        "progress": service.progress(),
        "restored_from": service.restored_from,
        "donations": service.donations.summary(),
        "algorithm": core.config.to_dict(),
    }
