"""A few optimizer steps must really learn: the loss, the eval and the data all fit together."""

from __future__ import annotations

import torch

from ddiloco.train.tasks import make_task


def _train(task, steps: int, batch_size: int, lr: float, seed: int = 0) -> tuple[list[float], torch.nn.Module]:
    torch.manual_seed(seed)
    model = task.build_model(seed)
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.01)
    stream = task.stream(0, 1, batch_size, seed)
    losses = []
    for _ in range(steps):
        loss = task.loss(model, stream.next())
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        losses.append(float(loss.detach()))
    return losses, model


def _check_lm_learns(name: str, path: str) -> None:
    task = make_task(name, path, model_size="tiny", seq_len=32)
    before = task.evaluate(task.build_model(0), max_batches=4)["eval_loss"]
    losses, model = _train(task, steps=40, batch_size=16, lr=1e-2)
    start, end = losses[0], sum(losses[-5:]) / 5
    assert start > 5.0  # ~ln(256) at initialisation
    assert end < start - 1.5, (start, end)
    after = task.evaluate(model, max_batches=4)["eval_loss"]
    assert after < before - 1.0, (before, after)


def test_tiny_gpt_learns_shakespeare(shakespeare: str) -> None:
    _check_lm_learns("gpt", shakespeare)


def test_tiny_moe_learns_shakespeare(shakespeare: str) -> None:
    _check_lm_learns("gpt-moe", shakespeare)


def test_vision_learns_digits() -> None:
    task = make_task("vision")
    chance = task.evaluate(task.build_model(0))["eval_accuracy"]
    losses, model = _train(task, steps=120, batch_size=32, lr=3e-3)
    acc = task.evaluate(model)["eval_accuracy"]
    assert chance < 0.3
    assert acc > 0.9, acc
    assert sum(losses[-10:]) / 10 < losses[0] - 1.0
