import pytest

from ddiloco.core import Schedule


def test_offsets_spread_over_period():
    assert [Schedule(4, 8, 2).offset(p) for p in range(4)] == [0, 2, 4, 6]
    assert [Schedule(3, 8, 2).offset(p) for p in range(3)] == [0, 2, 5]
    assert [Schedule(24, 24, 2).offset(p) for p in range(24)] == list(range(24))


def test_first_send_at_offset_plus_period_minus_overlap_then_every_period():
    s = Schedule(4, 8, 2)
    anchor = s.initial_anchor(fragment=1, join_step=0)  # t_1 = 2
    due = [step for step in range(1, 30) if s.is_due(step, anchor)]
    assert due[0] == 2 + 8 - 2
    # after a send at step 8 the anchor moves there: next due 8 steps later
    assert not s.is_due(15, 8) and s.is_due(16, 8)


def test_invalid_schedules():
    with pytest.raises(ValueError):
        Schedule(5, 4, 1)  # P > H
    with pytest.raises(ValueError):
        Schedule(2, 4, 4)  # tau >= H
    with pytest.raises(IndexError):
        Schedule(2, 4, 1).offset(2)
