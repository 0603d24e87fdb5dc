"""The exported failure trace: the learners' pauses, scaled, in the shared CSV format."""

from __future__ import annotations

import numpy as np
import pytest

from ddiloco.chaos.trace import FailureTrace, Outage
from ddiloco.goodput.config import GoodputConfig
from ddiloco.goodput.decoupled import simulate_decoupled
from ddiloco.goodput.failures import SliceOutages, sample_outages
from ddiloco.goodput.trace_export import learner_trace

CFG = GoodputConfig(slice_chips=100, reconfig_s=5.0, rejoin_s=4.0)  # pauses of 5 + 5 + 4 s


def test_trace_holds_each_learners_pauses():
    # 4 slices, 2 learners. Slice 0 (learner 0) down [101,400): paused [101,115) and [400,403).
    # Slice 3 (learner 1) down from before the start to 50: paused [50,53).
    out = SliceOutages.from_lists([(0, 101, 400), (3, -10, 50)], [100] * 4, 1000.0)
    trace = learner_trace(out, 2, CFG)
    assert trace.outages == (Outage(50.0, 1, 53.0), Outage(101.0, 0, 115.0), Outage(400.0, 0, 403.0))


def test_trace_is_scaled_and_round_trips_through_csv(tmp_path):
    out = SliceOutages.from_lists([(0, 101, 400)], [100] * 4, 1000.0)
    trace = learner_trace(out, 2, CFG, scale=10.0)
    assert trace.outages == (Outage(10.1, 0, 11.5), Outage(40.0, 0, 40.3))
    path = tmp_path / "t.csv"
    trace.save(path)
    assert path.read_text().startswith("learner,down_at,up_at\n")
    assert FailureTrace.load(path).outages == trace.outages


def test_trace_downtime_matches_the_simulated_uptime():
    cfg = GoodputConfig(days=1.0)
    out = sample_outages(600_000, cfg, np.random.default_rng(0))
    trace = learner_trace(out, 2, cfg)
    r = simulate_decoupled(out, 2, cfg)
    h = cfg.horizon_s
    # Uptime (K = 1) is the share of time not both learners are down.
    assert trace.learners <= {0, 1}
    t = np.linspace(0, h, 20_001)[:-1]
    both_down = np.ones_like(t, dtype=bool)
    for m in (0, 1):
        down = np.zeros_like(t, dtype=bool)
        for o in trace.outages:
            if o.learner == m:
                down |= (t >= o.down_at) & (t < o.up_at)
        both_down &= down
    assert 1 - both_down.mean() == pytest.approx(r.uptime, abs=0.01)
    assert sum(trace.downtime(m, h) for m in (0, 1)) > 0


def test_trace_rejects_a_bad_scale():
    out = SliceOutages.from_lists([(0, 101, 400)], [100] * 2, 1000.0)
    with pytest.raises(ValueError):
        learner_trace(out, 2, CFG, scale=0)
