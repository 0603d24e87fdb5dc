import pytest
import torch

from ddiloco.core import balanced_fragments, plan_for_model


def test_largest_first_into_lightest_by_hand():
    # sizes 100, 60, 50, 40, 10 into 2: 100->f0, 60->f1, 50->f1 (110), 40->f0 (140), 10->f1 (120)
    plan = balanced_fragments([("a", 10), ("b", 100), ("c", 50), ("d", 60), ("e", 40)], 2)
    assert plan.names == (("b", "e"), ("a", "c", "d"))
    assert plan.sizes == (140, 120)
    assert plan.total_size == 260
    assert plan.share(0) == pytest.approx(140 / 260)
    assert plan.fragment_of("d") == 1


def test_ties_are_deterministic():
    plan = balanced_fragments([("x", 5), ("y", 5), ("z", 5), ("w", 5)], 2)
    assert plan.names == (("x", "z"), ("y", "w"))


def test_every_tensor_in_exactly_one_fragment_and_balanced():
    model = torch.nn.Sequential(*[torch.nn.Linear(8 + i, 8 + i + 1) for i in range(10)])
    params = dict(model.named_parameters())
    plan = plan_for_model(params, 4)
    names = plan.all_names()
    assert sorted(names) == sorted(params)
    assert len(names) == len(set(names))
    assert sum(plan.sizes) == sum(p.numel() for p in params.values())
    largest = max(p.numel() for p in params.values())
    assert max(plan.sizes) - min(plan.sizes) <= largest


def test_bad_inputs():
    with pytest.raises(ValueError, match="at most as many fragments"):
        balanced_fragments([("a", 1)], 2)
    with pytest.raises(ValueError, match=">= 1"):
        balanced_fragments([("a", 1)], 0)
    with pytest.raises(ValueError, match="unique"):
        balanced_fragments([("a", 1), ("a", 2)], 1)
