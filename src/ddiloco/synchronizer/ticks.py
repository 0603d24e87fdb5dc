"""The synchronizer's timer: failure detection, grace deadlines, the run's budget and its drain.

Runs every half heartbeat and at the core's next grace deadline, under the service lock.
"""

from __future__ import annotations

import logging
import time
from typing import Any

from . import status

log = logging.getLogger("ddiloco.synchronizer.service")


def tick(service: Any) -> None:
    """`service`: the `SynchronizerService` (not imported: it imports this module)."""
    now, mono = service.now(), time.monotonic()
    failure = service.settings.timeouts.failure
    for s in service.sessions:
        service.membership.book_tokens(s)
        service.membership.grant_tokens(s)  # a heartbeat that found the lock taken gets its grant from here
    for s in service.sessions:
        silent = mono - s.last_seen
        if silent > failure:
            service.sessions.close(s)
            reason = f"no heartbeat for {silent:.1f} s (failure timeout {failure:g} s)"
            log.warning("learner %d declared gone: %s", s.learner, reason)
            service.events.write("leave", learner=s.learner, incarnation=s.incarnation, reason=reason)
            service.dispatch(service.core.leave(s.learner, now, service.arrivals.waiting()), now)
    service.dispatch(service.core.poll(now, service.arrivals.waiting()), now)
    service.dispatcher.forget_encoded()
    open_now = {(r.fragment, r.version) for r in service.core.open_rounds()}
    service.quorum_logged &= open_now
    for p, version, reason in status.waiting_rounds(service.core, now, service.settings.timeouts.failure):
        if (p, version) not in service.quorum_logged:  # once per round
            service.quorum_logged.add((p, version))
            log.warning(reason)
            service.events.write("no_quorum", fragment=p, version=version, reason=reason)
    if not service.stopping:
        reason = service.budget.exhausted(service.budget_tokens(), time.time())
        if reason is not None:
            service.begin_stop(reason)
    if service.stopping and not service.finished.is_set():
        drained = not service.sessions and not service.core.open_rounds() and not service.core.merging
        if drained or time.monotonic() - service.stop_mono > service.settings.timeouts.drain:
            if not drained:
                log.warning(
                    "drain timeout: %d learners still registered, %d rounds open",
                    len(service.sessions),
                    len(service.core.open_rounds()),
                )
            service.finished.set()
