"""The service's end of #46's review item: the final flush's rounds gather within the drain, so a
round open when the run stops merges before the drain ends instead of being abandoned with its
accepted work. (The algorithm's side is worked by hand in tests/core/test_late.py.)"""

from __future__ import annotations

import torch

from ddiloco.core import AlgorithmConfig
from ddiloco.core.messages import Contribution
from ddiloco.synchronizer.server import build_service
from ddiloco.synchronizer.service import FLUSH_SHARE
from ddiloco.synchronizer.settings import ServiceSettings
from ddiloco.wire.timeouts import Timeouts


def test_a_stopping_service_ends_the_final_flush_within_its_drain():
    # H = 24 at 0.3 s steps: a gathering window of 14.4 s against a 12 s drain (the defaults)
    algorithm = AlgorithmConfig(fragments=1, sync_every=24, overlap=1, quorum=1, grace=0.0, merge="mean")
    timeouts = Timeouts()
    assert timeouts.drain == 12.0
    service = build_service({"w": torch.zeros(4)}, algorithm, ServiceSettings(timeouts=timeouts, max_learners=3))
    core = service.core
    for m in range(3):
        core.join(m, 0.0)
    started = service.now()
    service.begin_stop("budget reached")
    assert core.flush_ends is not None
    assert started < core.flush_ends <= service.now() + FLUSH_SHARE * timeouts.drain < service.now() + timeouts.drain
    # learner 0's last work opens a gathering round that waits for the two others, live and silent
    core.receive(Contribution(0, 0, 0, {"w": -torch.ones(4)}, 24, 100, 7.2, 0.3, 1), now=service.now())
    assert [r.fragment for r in core.open_rounds()] == [0]
    deadline = core.next_deadline()
    assert deadline is not None and deadline <= core.flush_ends  # not opened_at + 14.4 s
    assert [type(a).__name__ for a in core.poll(deadline)][0] in ("Merged", "MergeDue")
