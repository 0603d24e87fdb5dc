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


def test_fragments_by_name_keep_the_groups_given_and_the_model_order_inside():
    from ddiloco.core.fragments import named_fragments

    plan = named_fragments([("a", 10), ("b", 100), ("c", 50), ("d", 60)], [["c", "a"], ["d"], ["b"]])
    assert plan.names == (("a", "c"), ("d",), ("b",))
    assert plan.sizes == (60, 60, 100)
    assert plan.fragment_of("b") == 2


@pytest.mark.parametrize(
    ("groups", "message"),
    [
        ([["a", "b"], ["c", "x"]], "'x', which is not a parameter"),
        ([["a", "b"], ["c", "a"]], "'a' is in fragments 0 and 1"),
        ([["a"], ["c"]], "1 parameters are in no fragment"),
        ([["a", "b", "c"], []], "fragment 1 names no parameter"),
        ([], "give a list of fragments"),
        (["abc"], "give a list of fragments"),
    ],
)
def test_fragments_by_name_are_refused_unless_each_parameter_is_in_exactly_one(groups, message):
    from ddiloco.core.fragments import named_fragments

    with pytest.raises(ValueError, match=message):
        named_fragments([("a", 1), ("b", 2), ("c", 3)], groups)
