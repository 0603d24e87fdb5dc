"""`client.attach(optimizer)`: every optimizer step taken is one `client.step`, and no other.

A recording stand-in for the client counts by hand what the hook hands on (with a real GradScaler on
the CPU, inf gradients forced on chosen steps); one run against a real synchronizer checks that the
client's own counters and merges follow."""

from __future__ import annotations

import pytest
import torch

from ddiloco.learner.attach import Attachment

from ..support.runtime import mlp_run, wait_for

pytestmark = pytest.mark.timeout(60)


class Recorder:
    """What the hook needs of a LearnerClient: its state and `step`."""

    def __init__(self, state: str = "training") -> None:
        self.state = state
        self.calls: list[tuple[int, float | None]] = []

    def step(self, tokens, seconds=None, position=None, loss=None):
        self.calls.append((tokens, loss))
        return []


def model_and_data():
    torch.manual_seed(0)
    return torch.nn.Linear(4, 1), torch.randn(8, 4)


def test_each_optimizer_step_is_one_client_step_until_detached():
    model, x = model_and_data()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    client = Recorder()
    handle = Attachment(client, optimizer, tokens_per_step=8, count_tokens=None, loss=None)
    for _ in range(7):
        model(x).pow(2).mean().backward()
        optimizer.step()
        optimizer.zero_grad()
    assert client.calls == [(8, None)] * 7 and handle.steps == 7 and handle.tokens == 56
    handle.detach()
    handle.detach()  # idempotent
    optimizer.step()
    assert len(client.calls) == 7 and not handle.attached


def test_count_tokens_and_loss_are_read_at_each_step():
    model, x = model_and_data()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    client, seen = Recorder(), iter([3, 5, 7])
    losses = iter([2.0, 1.5, 1.0])
    with Attachment(client, optimizer, None, lambda: next(seen), lambda: next(losses)):
        for _ in range(3):
            optimizer.step()
    optimizer.step()  # after the with block: detached
    assert client.calls == [(3, 2.0), (5, 1.5), (7, 1.0)]


@pytest.mark.parametrize("fused", [False, True], ids=["scaler-skips-step", "fused-optimizer-skips-inside"])
def test_steps_the_grad_scaler_skipped_are_not_counted(fused):
    """Steps 1 and 4 of 6 get an inf gradient: GradScaler skips them (by not calling step, or, for a
    fused optimizer, by handing it found_inf), so 4 steps count and the parameters moved 4 times."""
    model, x = model_and_data()
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.1, fused=fused)
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0**4)
    client = Recorder()
    handle = Attachment(client, optimizer, tokens_per_step=8, count_tokens=None, loss=None)
    moved = 0
    for i in range(6):
        before = model.weight.detach().clone()
        scaler.scale(model(x).pow(2).mean()).backward()
        if i in (1, 4):
            model.weight.grad[0, 0] = float("inf")
        scaler.step(optimizer)
        scaler.update()
        optimizer.zero_grad()
        moved += not torch.equal(before, model.weight)
    assert moved == 4  # the scaler really skipped two steps
    assert len(client.calls) == 4 and handle.steps == 4
    assert handle.skipped == (2 if fused else 0)  # a fused optimizer's skips reach the hook and are refused there


def test_a_step_before_start_is_an_error_and_steps_after_finish_are_ignored():
    model, _ = model_and_data()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    client = Recorder(state="new")
    Attachment(client, optimizer, tokens_per_step=1, count_tokens=None, loss=None)
    with pytest.raises(RuntimeError, match="before client.start"):
        optimizer.step()
    client.state = "closed"
    optimizer.step()
    assert client.calls == []


def test_exactly_one_way_of_counting_tokens():
    model, _ = model_and_data()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    for tokens, count in ((None, None), (4, lambda: 4)):
        with pytest.raises(ValueError, match="exactly one"):
            Attachment(Recorder(), optimizer, tokens, count, None)
    with pytest.raises(ValueError, match="positive"):
        Attachment(Recorder(), optimizer, 0, None, None)


def test_an_attached_loop_trains_with_a_real_synchronizer():
    with mlp_run() as (service, client, model):
        optimizer = torch.optim.SGD(model.parameters(), lr=1e-2)
        handle = client.attach(optimizer, tokens_per_step=16, loss=lambda: 0.5)
        for _ in range(40):  # no client.step anywhere in the loop
            model(torch.randn(16, 8)).pow(2).mean().backward()
            optimizer.step()
            optimizer.zero_grad()
        assert client.steps == 40 and client.tokens == 40 * 16 and handle.steps == 40
        wait_for(lambda: service.status()["merges"] > 0, 20, message="a merge of the attached learner's work")
        handle.detach()
