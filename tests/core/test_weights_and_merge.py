import math

import pytest
import torch

from ddiloco.core import (
    NesterovOuterOptimizer,
    merge_outer_gradients,
    outer_gradient,
    radial_directional_average,
    token_weight,
    weighted_mean,
)


def test_token_weight_is_tokens_squared_over_steps():
    assert token_weight(100, 4) == 2500.0
    assert token_weight(0, 3) == 0.0
    assert token_weight(50, 0) == 0.0
    # twice the work with the same batch size counts twice as much
    assert token_weight(200, 8) == 2 * token_weight(100, 4)
    with pytest.raises(ValueError):
        token_weight(-1, 1)


def test_weighted_mean_by_hand():
    out = weighted_mean([torch.tensor([3.0, 0.0]), torch.tensor([0.0, 4.0])], [1, 3])
    assert torch.allclose(out, torch.tensor([0.75, 3.0]))


def test_rda_by_hand():
    # norms 3 and 4 -> mean norm 3.5; unit directions (1,0),(0,1) -> mean (0.5,0.5) -> unit (1,1)/sqrt2
    out = radial_directional_average([torch.tensor([3.0, 0.0]), torch.tensor([0.0, 4.0])], [1, 1])
    expected = 3.5 / math.sqrt(2)
    assert torch.allclose(out, torch.tensor([expected, expected]))
    # a plain average would be much shorter: RDA keeps the typical norm
    assert torch.linalg.vector_norm(out) == pytest.approx(3.5)
    assert torch.linalg.vector_norm(
        weighted_mean([torch.tensor([3.0, 0.0]), torch.tensor([0.0, 4.0])], [1, 1])
    ) == pytest.approx(2.5)


def test_rda_weighted_by_hand():
    # weights 3:1 -> norm (3*3 + 1*4)/4 = 3.25; direction (0.75, 0.25) -> unit (3,1)/sqrt10
    out = radial_directional_average([torch.tensor([3.0, 0.0]), torch.tensor([0.0, 4.0])], [3, 1])
    assert torch.allclose(out, 3.25 * torch.tensor([3.0, 1.0]) / math.sqrt(10))


def test_rda_of_one_is_identity_and_zero_safe():
    v = torch.randn(5)
    assert torch.allclose(radial_directional_average([v], [2.0]), v, atol=1e-6)
    assert torch.equal(radial_directional_average([torch.zeros(3), torch.zeros(3)], [1, 1]), torch.zeros(3))
    # opposite directions cancel
    assert torch.allclose(radial_directional_average([torch.ones(2), -torch.ones(2)], [1, 1]), torch.zeros(2))


def test_merge_uses_plain_average_for_embeddings_only():
    a = {"emb": torch.tensor([3.0, 0.0]), "w": torch.tensor([3.0, 0.0])}
    b = {"emb": torch.tensor([0.0, 4.0]), "w": torch.tensor([0.0, 4.0])}
    merged = merge_outer_gradients([a, b], [1, 1], plain_names={"emb"}, mode="rda")
    assert torch.allclose(merged["emb"], torch.tensor([1.5, 2.0]))
    assert torch.linalg.vector_norm(merged["w"]) == pytest.approx(3.5)
    plain = merge_outer_gradients([a, b], [1, 1], plain_names={"emb"}, mode="mean")
    assert torch.allclose(plain["w"], torch.tensor([1.5, 2.0]))


def test_merge_rejects_bad_input():
    with pytest.raises(ValueError):
        merge_outer_gradients([], [])
    with pytest.raises(ValueError):
        merge_outer_gradients([{"a": torch.ones(1)}, {"b": torch.ones(1)}], [1, 1])
    with pytest.raises(ValueError):
        weighted_mean([torch.ones(1)], [0.0])
    with pytest.raises(ValueError):
        merge_outer_gradients([{"a": torch.ones(1)}], [1], mode="median")


def test_outer_gradient_sign_by_hand():
    # Global value 1.0; the learner trained it up to 1.5. v = Theta - theta = -0.5.
    v = outer_gradient(torch.tensor([1.0]), torch.tensor([1.5]))
    assert v.item() == pytest.approx(-0.5)
    # Outer SGD step without momentum, lr 0.7: Theta <- 1.0 - 0.7 * (-0.5) = 1.35, towards the learner.
    params = {"w": torch.tensor([1.0])}
    NesterovOuterOptimizer(lr=0.7, momentum=0.0).step(params, {"w": v})
    assert params["w"].item() == pytest.approx(1.35)
    # lr 1, no momentum: the global model becomes exactly the learner's.
    params = {"w": torch.tensor([1.0])}
    NesterovOuterOptimizer(lr=1.0, momentum=0.0).step(params, {"w": v})
    assert params["w"].item() == pytest.approx(1.5)


def test_nesterov_by_hand():
    # lr 0.5, mu 0.9, delta 1 twice: buf 1 -> update 1.9 -> 1 - 0.95 = 0.05;
    # buf 1.9 -> update 1 + 1.71 = 2.71 -> 0.05 - 1.355 = -1.305
    params = {"w": torch.tensor([1.0])}
    opt = NesterovOuterOptimizer(lr=0.5, momentum=0.9)
    opt.step(params, {"w": torch.tensor([1.0])})
    assert params["w"].item() == pytest.approx(0.05)
    opt.step(params, {"w": torch.tensor([1.0])})
    assert params["w"].item() == pytest.approx(-1.305)


def test_update_is_the_step_apply_takes_at_lr_one_and_changes_nothing():
    # mu 0.9, delta 1 twice (as above): the first update is 1 + 0.9 * 1 = 1.9, the second, with buf 1,
    # 1 + 0.9 * (0.9 * 1 + 1) = 2.71; asking for it moves neither the parameters nor the buffer
    params = {"w": torch.tensor([1.0])}
    opt = NesterovOuterOptimizer(lr=0.5, momentum=0.9)
    scaled = {"w": (torch.tensor([1.0]), 1.0)}
    assert opt.update(scaled)["w"].item() == pytest.approx(1.9)
    assert params["w"].item() == 1.0 and opt.buffers == {}
    opt.step(params, {"w": torch.tensor([1.0])})
    assert opt.update(scaled)["w"].item() == pytest.approx(2.71)
    assert opt.buffers["w"].item() == pytest.approx(1.0)
    assert opt.update(scaled, use_momentum=False)["w"].item() == pytest.approx(1.0)


def test_nesterov_matches_torch_sgd_and_state_round_trips():
    torch.manual_seed(0)
    start = torch.randn(4, 3)
    deltas = [torch.randn(4, 3) for _ in range(5)]
    ours = {"w": start.clone()}
    opt = NesterovOuterOptimizer(lr=0.7, momentum=0.9)
    ref = torch.nn.Parameter(start.clone())
    sgd = torch.optim.SGD([ref], lr=0.7, momentum=0.9, nesterov=True)
    for i, d in enumerate(deltas):
        if i == 3:  # checkpoint and restore mid-way
            state = opt.state_dict()
            opt = NesterovOuterOptimizer(lr=0.7, momentum=0.9)
            opt.load_state_dict(state)
        opt.step(ours, {"w": d})
        ref.grad = d.clone()
        sgd.step()
    assert torch.allclose(ours["w"], ref.detach(), atol=1e-6)


def test_outer_optimizer_rejects_bad_input():
    with pytest.raises(ValueError):
        NesterovOuterOptimizer(lr=0)
    with pytest.raises(ValueError):
        NesterovOuterOptimizer(momentum=1.0)
    opt = NesterovOuterOptimizer()
    with pytest.raises(KeyError):
        opt.step({"w": torch.zeros(2)}, {"v": torch.zeros(2)})
    with pytest.raises(ValueError):
        opt.step({"w": torch.zeros(2)}, {"w": torch.zeros(3)})


def test_outer_step_is_all_or_nothing_when_it_would_overflow():
    from ddiloco.core import NesterovOuterOptimizer

    opt = NesterovOuterOptimizer(lr=1.0, momentum=0.9)
    params = {"a": torch.tensor([1.0]), "b": torch.tensor([-3.0e38])}
    opt.step(params, {"a": torch.tensor([0.5]), "b": torch.tensor([0.0])})
    before = {k: v.clone() for k, v in params.items()}, opt.state_dict()
    with pytest.raises(FloatingPointError, match="b"):
        opt.step(params, {"a": torch.tensor([0.5]), "b": torch.tensor([3.0e38])})
    assert all(torch.equal(params[k], before[0][k]) for k in params)  # "a" was not touched either
    assert all(torch.equal(opt.state_dict()[k], before[1][k]) for k in before[1])
