import pytest

from ddiloco.core import Ema, GraceWindow


def test_ema():
    e = Ema(0.5)
    assert e.get(7.0) == 7.0
    assert e.update(2.0) == 2.0
    assert e.update(4.0) == 3.0
    with pytest.raises(ValueError):
        e.update(-1.0)


def test_grace_window_by_hand():
    g = GraceWindow(overlap=2, gamma=0.5, alpha=1.0)
    assert g.length(0.0) == 0.0  # no step time observed yet: admit nobody extra
    g.step_time.update(1.0)
    g.sync_time.update(0.4)
    # slack = 2 * 1.0 - (0.2 + 0.4) = 1.4; grace = 0.7
    assert g.slack(0.2) == pytest.approx(1.4)
    assert g.length(0.2) == pytest.approx(0.7)
    # no slack left: no grace
    assert g.length(1.8) == 0.0
    state = g.state_dict()
    h = GraceWindow(overlap=2, gamma=0.5, alpha=1.0)
    h.load_state_dict(state)
    assert h.length(0.2) == pytest.approx(0.7)
