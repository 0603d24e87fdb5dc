import pytest

from ddiloco.chaos.injector import ChaosInjector, ChaosSettings, learner_trace
from ddiloco.chaos.trace import FailureTrace, Outage


def test_mtbf_schedule_is_drawn_up_front_from_the_seed_with_fixed_downtime():
    s = ChaosSettings(learner_mtbf=20.0, learner_down=5.0, seed=3)
    a, b = learner_trace(s, 4, 600.0), learner_trace(s, 4, 600.0)
    assert a == b and a.outages
    assert all(o.duration == pytest.approx(5.0) for o in a.outages)
    assert learner_trace(ChaosSettings(learner_mtbf=20.0, seed=4), 4, 600.0) != a
    per_learner = len(a.outages) / 4
    assert 600 / 25 * 0.5 < per_learner < 600 / 25 * 1.6  # about horizon / (mtbf + down) each


def test_injector_hands_out_due_events_in_time_order():
    trace = FailureTrace.of([Outage(2.0, 1, 4.0)])
    inj = ChaosInjector(ChaosSettings(trace=trace, kill_synchronizer_at=3.0, synchronizer_down=0.5), 2, 60.0)
    assert inj.due(1.0) == []
    kinds = [(e.kind, e.target) for e in inj.due(5.0)]
    assert kinds == [("kill_learner", 1), ("kill_sync", 0), ("restart_sync", 0), ("restart_learner", 1)]
    assert inj.downtime(1, 60.0) == 2.0


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"learner_mtbf": 10.0, "trace": FailureTrace()}, "not both"),
        ({"straggle": 0.0}, "straggle"),
        ({"learner_down": -1.0}, ">= 0"),
    ],
)
def test_bad_settings_are_refused(kwargs, message):
    with pytest.raises(ValueError, match=message):
        ChaosSettings(**kwargs)


def test_each_listed_shard_is_killed_in_turn_and_restarted():
    from ddiloco.chaos.injector import ChaosInjector, ChaosSettings

    inj = ChaosInjector(
        ChaosSettings(kill_synchronizer_at=6.0, synchronizer_down=1.0, kill_shards=(0, 2), kill_every=3.0),
        learners=2,
        horizon=60.0,
    )
    events = [(e.time, e.kind, e.target) for e in inj.due(100.0)]
    assert events == [(6.0, "kill_sync", 0), (7.0, "restart_sync", 0), (9.0, "kill_sync", 2), (10.0, "restart_sync", 2)]
    import pytest

    with pytest.raises(ValueError):
        ChaosSettings(kill_synchronizer_at=1.0, kill_shards=())
