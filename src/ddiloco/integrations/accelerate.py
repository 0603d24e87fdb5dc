"""`join`: an `Accelerator` loop (without the Trainer) as a Decoupled DiLoCo learner.

    model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
    client = join(accelerator, model, optimizer, "10.0.0.5:7070", learner_id=0)
    for batch in loader:
        ...; accelerator.backward(loss); optimizer.step(); optimizer.zero_grad()
        if client.stopping: break
    client.finish()

The client gets the unwrapped model and is attached to the torch optimizer inside Accelerate's
wrapper, so a step the grad scaler skipped (or a gradient-accumulation micro-step, which does not step
the inner optimizer) is not counted. Tokens are those of the training forward passes since the last
step, unless `tokens_per_step` is given. DeepSpeed ZeRO and FSDP1 are refused (`common`); FSDP2 works.
"""

from __future__ import annotations

from typing import Any

from ddiloco.integrations.common import TokenCounter, refuse_deepspeed, refuse_fsdp1, torch_optimizer
from ddiloco.learner.client import LearnerClient


def join(
    accelerator: Any,
    model: Any,
    optimizer: Any,
    address: str,
    learner_id: int,
    *,
    tokens_per_step: int | None = None,
    token_key: str = "input_ids",
    **client_kwargs: Any,
) -> LearnerClient:
    """Create, start and attach a client on this process (every rank calls it); returns it started.
    `client.finish()` at the end (collective); `client.attachment` is the hook's handle."""
    refuse_deepspeed(accelerator=accelerator)
    refuse_fsdp1(model=model)
    module = accelerator.unwrap_model(model)
    inner = torch_optimizer(optimizer)
    client = LearnerClient(module, address, learner_id, optimizer=inner, **client_kwargs)
    client.start()
    if tokens_per_step is None:
        counter = TokenCounter(module, token_key)
        client.attachment = client.attach(inner, count_tokens=counter.take)  # type: ignore[attr-defined]
    else:
        client.attachment = client.attach(inner, tokens_per_step=tokens_per_step)  # type: ignore[attr-defined]
    return client
