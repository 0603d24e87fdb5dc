"""Each method's accounting on tiny cases worked out by hand (numbers in the comments).

Constants unless a test says otherwise: detect 5 s, reconfigure 5 s, scale-up 3 s, rejoin 4 s,
step 2 s, ddp restart 25 s and checkpoint every 10 s. Horizon 1000 s, slices of 100 chips.
Failures strike running chips only: a group's k-th failure lands the windows of its earlier
failures later than drawn (`timeline.failure_clock_shift`), and the repair moves with it.
"""

from __future__ import annotations

import numpy as np
import pytest

from ddiloco.goodput.config import GoodputConfig
from ddiloco.goodput.ddp import simulate_ddp
from ddiloco.goodput.decoupled import simulate_decoupled
from ddiloco.goodput.diloco import simulate_diloco
from ddiloco.goodput.elastic import simulate_elastic_ddp
from ddiloco.goodput.failures import SliceOutages
from ddiloco.goodput.progress import Cumulative
from ddiloco.goodput.timeline import (
    Events,
    Segments,
    failure_clock_shift,
    running_segments,
)

CFG = GoodputConfig(
    slice_chips=100, reconfig_s=5.0, restart_s=25.0, checkpoint_s=10.0, rejoin_s=4.0, repair_mean_hours=1.0
)
KEEP = 1.0 - CFG.repair_share  # ddp's goodput counts its hot spares: N / (1 - share under repair) chips
H = 1000.0


def outages(rows, slices=3):
    return SliceOutages.from_lists(rows, [100] * slices, H)


# ---------------------------------------------------------------- the sweep itself


def test_no_event_means_running_all_the_time():
    seg = running_segments(Events.empty(), np.array([300]), np.array([100]), H, 2.0)
    assert seg.start.tolist() == [0.0] and seg.end.tolist() == [H] and seg.live.tolist() == [200.0]


def test_windows_merge_when_they_overlap_and_groups_stay_apart():
    ev = Events(
        time=np.array([10.0, 12.0, 30.0, 10.0]),
        group=np.array([0, 0, 0, 1]),
        window=np.array([5.0, 5.0, 5.0, 100.0]),
        failure=np.array([True, True, False, True]),
        delta=np.array([0, 0, 0, 0]),
    )
    seg = running_segments(ev, np.array([10, 10]), np.zeros(2), 200.0, 1.0)
    g0, g1 = seg.of_group(0), seg.of_group(1)
    # Group 0: pause [10, 17) (12 + 5 extends 15 to 17), pause [30, 35).
    assert list(zip(g0.start, g0.end, strict=True)) == [(0.0, 10.0), (17.0, 30.0), (35.0, 200.0)]
    # Group 1's long window does not leak into group 0.
    assert list(zip(g1.start, g1.end, strict=True)) == [(0.0, 10.0), (110.0, 200.0)]


def test_failure_clock_stops_during_each_groups_own_failure_pauses():
    # Group 0 fails at 10, 12, 50 with 5-s windows; group 1 at 11 with a 100-s window (given unsorted).
    shift = failure_clock_shift(
        np.array([50.0, 11.0, 12.0, 10.0]), np.array([0, 1, 0, 0]), np.array([5.0, 100.0, 5.0, 5.0])
    )
    assert shift.tolist() == [10.0, 0.0, 5.0, 0.0]  # group 1's window never moves group 0
    assert failure_clock_shift(np.zeros(0), np.zeros(0, np.int64), np.zeros(0)).size == 0


def test_cumulative_work_and_its_inverse():
    # Group 0 works [0,10) with 1 s lost at the end and [20,30) on 5 chips; group 1 works [5,8).
    seg = Segments(
        np.array([0, 0, 1]),
        np.array([0.0, 20.0, 5.0]),
        np.array([10.0, 30.0, 8.0]),
        np.array([10.0, 5.0, 2.0]),
        np.array([1.0, 0.0, 0.0]),
        np.array([True, False, False]),
        2,
        50.0,
    )
    cum = Cumulative(seg)
    g = np.array([0, 0, 0, 1, 1])
    t = np.array([5.0, 15.0, 25.0, 0.0, 50.0])
    assert cum.work_at(g, t).tolist() == [5.0, 9.0, 14.0, 0.0, 3.0]
    assert cum.useful_at(g, t).tolist() == [50.0, 90.0, 115.0, 0.0, 6.0]
    w = np.array([9.0, 9.5, 19.0, 3.0, 3.5])
    assert cum.time_for_work(g, w).tolist() == [9.0, 20.5, 30.0, 8.0, np.inf]


# ---------------------------------------------------------------- elastic data-parallel


def test_elastic_one_failure():
    # Slice 0 of 3 fails at 101 and is back at 400.
    # [0,101) 300 chips, 1 s of the step in flight lost -> 100 * 300 = 30 000
    # pause [101,111); [111,400) 200 chips -> 289 * 200 = 57 800
    # scale-up pause [400,403); [403,1000) 300 chips -> 597 * 300 = 179 100
    r = simulate_elastic_ddp(outages([(0, 101, 400)]), CFG)
    assert r.goodput == pytest.approx((30_000 + 57_800 + 179_100) / 300_000)
    assert r.uptime == pytest.approx((101 + 289 + 597) / 1000)


def test_elastic_failure_drawn_inside_a_pause_strikes_after_it():
    # Slice 0 down [101,400); slice 1 drawn down [105,300), inside the pause [101,111): its failure
    # moves 10 s later, to 115, and its repair with it, to [115,310).
    # [0,101) 300 chips, 1 s lost -> 30 000; pause [101,111); [111,115) 200 chips -> 800
    # pause [115,125); [125,310) 100 chips -> 18 500; pause [310,313); [313,400) 200 -> 17 400
    # pause [400,403); [403,1000) 300 chips -> 179 100
    r = simulate_elastic_ddp(outages([(0, 101, 400), (1, 105, 300)]), CFG)
    assert r.goodput == pytest.approx((30_000 + 800 + 18_500 + 17_400 + 179_100) / 300_000)
    assert r.uptime == pytest.approx((101 + 4 + 185 + 87 + 597) / 1000)


def test_elastic_later_failure_is_moved_by_the_earlier_pauses_only():
    # Slice 0 down [101,400); slice 1 drawn to fail at 401: after one 10-s failure pause, at 411.
    # [0,101) -> 30 000; [111,400) 200 chips -> 57 800; scale-up pause [400,403);
    # [403,411) 300 chips, 8 s (a step boundary, nothing lost) -> 2 400; [421,1000) 200 -> 115 800
    r = simulate_elastic_ddp(outages([(0, 101, 400), (1, 401, 2000)]), CFG)
    assert r.goodput == pytest.approx((30_000 + 57_800 + 2_400 + 115_800) / 300_000)
    assert r.uptime == pytest.approx((101 + 289 + 8 + 579) / 1000)


def test_elastic_return_during_a_failure_pause_is_folded_in():
    # Slice 1 is down from before the start and returns at 103, inside the pause [101,111) that
    # slice 0's failure opened: its 3-s scale-up ends at 106, the pause still ends at 111.
    # [0,101) 200 chips, 1 s lost -> 20 000; [111,1000) 200 chips (slice 0 out, 1 back) -> 177 800
    r = simulate_elastic_ddp(outages([(0, 101, 2000), (1, -50, 103)]), CFG)
    assert r.goodput == pytest.approx((20_000 + 177_800) / 300_000)
    assert r.uptime == pytest.approx((101 + 889) / 1000)


def test_elastic_slice_already_down_at_start_and_back_later():
    # Slice 2 is down from before the start until 500: 200 chips, then a scale-up pause.
    r = simulate_elastic_ddp(outages([(2, -50, 500)]), CFG)
    assert r.goodput == pytest.approx((500 * 200 + 497 * 300) / 300_000)


def test_elastic_all_slices_down_does_no_work():
    r = simulate_elastic_ddp(outages([(0, 100, 600)], slices=1), CFG)
    # [0,100) 100 chips, no step lost (100 is a step boundary); [603,1000) -> 397 * 100
    assert r.goodput == pytest.approx((100 * 100 + 397 * 100) / 100_000)
    assert r.uptime == pytest.approx((100 + 397) / 1000)


# ---------------------------------------------------------------- data-parallel, no elasticity


def test_ddp_one_failure_loses_work_since_checkpoint():
    # Failure at 437: [0,437) keeps 430 s (checkpoints every 10 s); down [437,467); [467,1000) 533 s.
    r = simulate_ddp([437.0], 300, H, CFG)
    assert r.goodput == pytest.approx((430 + 533) / 1000 * KEEP)
    assert r.uptime == pytest.approx((437 + 533) / 1000)


def test_ddp_failure_never_lands_inside_a_restart():
    # Drawn at 101, 120, 437; on the running clock 101, 120 + 30 = 150, 437 + 60 = 497.
    # [0,101) keeps 100; [131,150) keeps 10; [180,497) keeps 310; [527,1000) 473 (cut by the horizon).
    r = simulate_ddp([120.0, 101.0, 437.0], 300, H, CFG)
    assert r.goodput == pytest.approx((100 + 10 + 310 + 473) / 1000 * KEEP)
    assert r.uptime == pytest.approx((101 + 19 + 317 + 473) / 1000)


def test_ddp_without_failures_and_failures_outside_the_window():
    assert simulate_ddp([], 300, H, CFG).goodput == pytest.approx(KEEP)
    assert simulate_ddp([-5.0, 1000.0, 2000.0], 300, H, CFG).goodput == pytest.approx(KEEP)
    assert 0.98 < KEEP < 0.995  # 100-chip slices failing every 3 650 h, 1 h repairs: 2.7 % held


# ---------------------------------------------------------------- Decoupled DiLoCo


def test_decoupled_one_failure_touches_one_learner_only():
    # 4 slices, M = 2: learner 0 = slices 0,1; learner 1 = slices 2,3. Slice 0 down [101,400).
    # Learner 0: [0,101) 200 chips, 1 s lost -> 20 000; pause 5+5+4 -> [115,400) 100 chips -> 28 500;
    #            pause [400,403); [403,1000) 200 chips -> 119 400.  Learner 1: 1000 * 200 = 200 000.
    r = simulate_decoupled(outages([(0, 101, 400)], slices=4), 2, CFG)
    assert r.goodput == pytest.approx((20_000 + 28_500 + 119_400 + 200_000) / 400_000)
    assert r.uptime == 1.0


def test_decoupled_quorum_blocks_after_tau_steps():
    # Same failure with K = 2: while learner 0 is paused ([101,115) and [400,403)) learner 1 may run
    # tau * step = 4 s ahead, then waits: [105,115) is lost for it (10 s * 200 chips = 2 000);
    # the 3 s scale-up pause is inside the slack.
    r = simulate_decoupled(outages([(0, 101, 400)], slices=4), 2, CFG.with_(quorum=2))
    assert r.goodput == pytest.approx((20_000 + 28_500 + 119_400 + 200_000 - 2_000) / 400_000)
    assert r.uptime == pytest.approx(1 - (14 + 3) / 1000)


def test_decoupled_two_overlapping_failures_in_two_learners():
    # Slice 0 (learner 0) down [101,400), slice 2 (learner 1) down [105,300); K = 1: nobody waits.
    # Learner 1: [0,105) 200 chips, 1 s lost -> 20 800; pause [105,119); [119,300) 100 -> 18 100;
    #            pause [300,303); [303,1000) 200 -> 139 400.
    # Uptime: both learners are paused only during [105,115).
    r = simulate_decoupled(outages([(0, 101, 400), (2, 105, 300)], slices=4), 2, CFG)
    learner0 = 20_000 + 28_500 + 119_400
    learner1 = 20_800 + 18_100 + 139_400
    assert r.goodput == pytest.approx((learner0 + learner1) / 400_000)
    assert r.uptime == pytest.approx(1 - 10 / 1000)


def test_decoupled_failure_drawn_inside_a_learners_pause():
    # 6 slices, M = 2: learner 0 = slices 0,1,2. Slice 0 down [101,400); slice 1 drawn down [110,300),
    # inside learner 0's pause [101,115): it strikes 14 s later, down [124,314).
    # Learner 0: [0,101) 300 chips, 1 s lost -> 30 000; [115,124) 200 chips, 1 s lost -> 1 600;
    #            [138,314) 100 -> 17 600; [317,400) 200 -> 16 600; [403,1000) 300 -> 179 100.
    # Learner 1: 300 000.
    r = simulate_decoupled(outages([(0, 101, 400), (1, 110, 300)], slices=6), 2, CFG)
    assert r.goodput == pytest.approx((30_000 + 1_600 + 17_600 + 16_600 + 179_100 + 300_000) / 600_000)
    assert r.uptime == 1.0


def test_decoupled_with_one_learner_and_no_rejoin_is_elastic_ddp():
    rows = [(0, 101, 400), (1, 105, 300), (2, 401, 2000), (1, 700, 720)]
    cfg = CFG.with_(rejoin_s=0.0)
    assert simulate_decoupled(outages(rows), 1, cfg).goodput == pytest.approx(
        simulate_elastic_ddp(outages(rows), cfg).goodput
    )


# ---------------------------------------------------------------- synchronous DiLoCo


def test_diloco_outer_step_waits_for_the_paused_learner():
    # Horizon 100, 2 learners of two 100-chip slices, step 1 s, H = 10, no step-time noise.
    # Slice 0 (learner 0) down [25.5, 60): learner 0 runs [0,25.5) on 200 chips (0.5 s lost),
    # is paused (5+5+4) to 39.5, runs [39.5,60) on 100 chips, scale-up pause to 63, runs [63,100).
    # Its work: 25 + 20.5 + 37 = 82.5 s, useful 25*200 + 20.5*100 + 37*200 = 14 450 chip-s.
    # Outer steps: [0,10) [10,20) [20,44.5) [44.5,54.5) [54.5,67.5) then 67.5, 77.5, 87.5, 97.5.
    # Learner 1 idles [30,44.5) and [64.5,67.5): 82.5 s * 200 chips = 16 500 chip-s.
    # Nobody trains in [30,39.5).
    cfg = CFG.with_(step_s=1.0, inner_steps=10, step_cv=0.0)
    out = SliceOutages.from_lists([(0, 25.5, 60)], [100] * 4, 100.0)
    r = simulate_diloco(out, 2, cfg)
    assert r.goodput == pytest.approx((14_450 + 16_500) / (400 * 100))
    assert r.uptime == pytest.approx((100 - 9.5) / 100)


def test_diloco_with_one_learner_is_elastic_ddp():
    rows = [(0, 101, 400), (1, 105, 300), (2, 401, 2000)]
    cfg = CFG.with_(rejoin_s=0.0, step_cv=0.0)
    d = simulate_diloco(outages(rows), 1, cfg)
    e = simulate_elastic_ddp(outages(rows), cfg)
    assert d.goodput == pytest.approx(e.goodput) and d.uptime == pytest.approx(e.uptime)


def test_diloco_step_time_noise_makes_everyone_wait_for_the_slowest():
    out = SliceOutages.from_lists([], [100] * 8, 10_000.0)
    calm = simulate_diloco(out, 8, CFG.with_(step_cv=0.0))
    noisy = simulate_diloco(out, 8, CFG.with_(step_cv=0.2))
    assert calm.goodput == pytest.approx(1.0)
    # Max of 8 normals is about 1.42 sigma above the mean: sigma = 0.2 / sqrt(24) ~ 0.041.
    assert pytest.approx(noisy.goodput, abs=0.01) == 1 / (1 + 1.42 * 0.2 / 24**0.5)
