import pytest

from ddiloco.wire.timeouts import Timeouts


def test_defaults_are_derived_from_the_heartbeat():
    t = Timeouts.derive(0.5)
    assert t == Timeouts()
    t = Timeouts.derive(0.2)
    assert (t.failure, t.rpc, t.backoff_max, t.drain) == pytest.approx((1.2, 0.4, 0.6, 4.8))


@pytest.mark.parametrize(
    "overrides, message",
    [
        ({"failure": 1.0}, "failure"),
        ({"rpc": 5.0}, "rpc deadline"),
        ({"backoff_min": 0.0}, "backoff"),
        ({"drain": 1.0}, "drain"),
    ],
)
def test_inconsistent_timeouts_are_refused(overrides, message):
    with pytest.raises(ValueError, match=message):
        Timeouts.derive(0.5, **overrides)


def test_bulk_deadline_grows_with_size_and_round_trips():
    t = Timeouts()
    assert t.bulk(100e6) == pytest.approx(t.rpc + 10.0)
    assert Timeouts.from_dict(t.to_dict()) == t
