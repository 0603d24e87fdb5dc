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


def test_behind_a_link_the_window_covers_a_pulled_learners_answer_by_hand():
    """Eq. 3 leaves tau_0 steps once tau covers the link: shorter than a pull's answer behind it
    (the request's way, a step boundary, the push), so pulled learners always missed the round."""
    paper = GraceWindow(overlap=2, gamma=0.5, alpha=1.0)
    pulls = GraceWindow(overlap=2, gamma=0.5, alpha=1.0, cover_pulls=True)
    for g in (paper, pulls):
        g.step_time.update(0.1)
    # Eq. 3: 0.5 * (7 * 0.1 - 0.44) = 0.13; a pull's answer: 0.44 + 2 steps = 0.64
    assert paper.length(0.0, overlap=7, link=0.44) == pytest.approx(0.13)
    assert pulls.length(0.0, overlap=7, link=0.44) == pytest.approx(0.64)
    assert pulls.length(0.0) == pytest.approx(0.5 * 0.2)  # no link measured (loopback): Eq. 3 alone
    no_grace = GraceWindow(overlap=2, gamma=0.0, alpha=1.0, cover_pulls=True)
    no_grace.step_time.update(0.1)
    assert no_grace.length(0.0, overlap=7, link=0.44) == 0.0  # K = 1 without grace stays what it is
