"""Bytes a synchronizer shard moves to and from learners: bandwidth is one of the paper's headlines.
Also what the bulk socket plane turned away, by reason, so that Status shows an operator an attack."""

from __future__ import annotations

import threading
from collections import Counter


class Traffic:
    """Counted per frame on the bulk streams (contributions in, updates out), from any thread."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.bytes_received = 0
        self.bytes_sent = 0
        # updates as they start streaming, split by form: a difference from the version the learner
        # holds (`--codec-down int8/int4`), or a whole value (every bf16 update; a join, a reset or a
        # coalesced version under a difference codec); each difference of a chain is one update. How
        # many of each form a run sends, and which fragments (of different sizes) go which way, depend
        # on timing, and so does the average update's bytes: `difference_whole_bytes` does not.
        self.updates = {"difference": 0, "whole": 0}
        self.update_bytes = {"difference": 0, "whole": 0}
        # what the updates sent as differences would have cost as whole bf16 values (their payload): a
        # difference's bytes over these do not depend on which fragments went which way
        self.difference_whole_bytes = 0
        self._closed: Counter[str] = Counter()  # bulk socket connections closed or calls refused, by reason
        self.bulk_waiting = 0  # bulk socket connections not yet authenticated, or being drained (a gauge)

    def received(self, n: int) -> None:
        with self._lock:
            self.bytes_received += n

    def sent(self, n: int) -> None:
        with self._lock:
            self.bytes_sent += n

    def update(self, nbytes: int, as_difference: bool, whole_nbytes: int = 0) -> None:
        form = "difference" if as_difference else "whole"
        with self._lock:
            self.updates[form] += 1
            self.update_bytes[form] += nbytes
            if as_difference:
                self.difference_whole_bytes += whole_nbytes

    def closed(self, reason: str) -> None:
        """One bulk socket connection closed, or call refused, for `reason` (one of a few fixed keys)."""
        with self._lock:
            self._closed[reason] += 1

    def closed_counts(self) -> dict[str, int]:
        with self._lock:
            return dict(self._closed)
