"""A donated optimizer state, installed in a fresh optimizer, makes it take exactly the donor's next step."""

import torch

from ddiloco.learner import peerstate
from ddiloco.wire.protocol import state_checksum


def trained() -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.Linear(3, 1))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    for _ in range(5):
        model(torch.randn(8, 4)).pow(2).mean().backward()
        opt.step()
        opt.zero_grad()
    return model, opt


def test_snapshot_load_round_trip_gives_the_same_next_step():
    donor, donor_opt = trained()
    tensors, scalars = peerstate.snapshot(donor_opt, dict(donor.named_parameters()))
    assert set(tensors) == {f"{n}/{k}" for n, _ in donor.named_parameters() for k in ("exp_avg", "exp_avg_sq")}
    assert all(v == {"step": 5.0} for v in scalars.values())
    joiner = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.Linear(3, 1))
    joiner.load_state_dict(donor.state_dict())  # the same parameters (in a run: the global ones)
    joiner_opt = torch.optim.AdamW(joiner.parameters(), lr=1e-2)
    assert peerstate.load(joiner_opt, dict(joiner.named_parameters()), tensors, scalars) == 5
    assert state_checksum(*peerstate.snapshot(joiner_opt, dict(joiner.named_parameters()))) == state_checksum(
        tensors, scalars
    )
    x = torch.randn(8, 4)
    for model, opt in ((donor, donor_opt), (joiner, joiner_opt)):
        model(x).pow(2).mean().backward()
        opt.step()
    for a, b in zip(donor.parameters(), joiner.parameters(), strict=True):
        assert torch.equal(a, b)


def test_the_checksum_sees_any_change():
    _, opt = trained()
    tensors, scalars = peerstate.snapshot(opt, dict(trained()[0].named_parameters()))
    assert tensors == {}  # another model's parameters are not this optimizer's: nothing is taken
    model, opt = trained()
    tensors, scalars = peerstate.snapshot(opt, dict(model.named_parameters()))
    before = state_checksum(tensors, scalars)
    tensors["0.weight/exp_avg"][0, 0] += 1e-6
    assert state_checksum(tensors, scalars) != before
    scalars["0.weight"]["step"] = 6.0
    assert state_checksum({}, scalars) != state_checksum({}, {"0.weight": {"step": 5.0}})
