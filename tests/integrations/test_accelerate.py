"""The Accelerate path: `join(accelerator, model, optimizer, ...)` in an `Accelerator` loop with
gradient accumulation: one client step per optimizer step, with the tokens of all its micro-batches."""

from __future__ import annotations

import pytest
import torch

import ddiloco

pytest.importorskip("accelerate", reason="the Hugging Face extra: pip install -e '.[hf]'")

from ddiloco.integrations.accelerate import join  # noqa: E402

from ..support.runtime import FAST, wait_for  # noqa: E402

pytestmark = pytest.mark.timeout(90)


class TinyLM(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = torch.nn.Embedding(32, 8)
        self.head = torch.nn.Linear(8, 32)

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        logits = self.head(self.embed(input_ids))
        return torch.nn.functional.cross_entropy(logits.flatten(0, 1), input_ids.flatten())


def test_an_accelerator_loop_joins_counts_each_optimizer_step_and_merges():
    from accelerate import Accelerator

    torch.manual_seed(0)
    sync = ddiloco.Synchronizer(TinyLM(), learners=1, sync_every=2, overlap=1, quorum=1, grace=0.0, fragments=2)
    address = sync.start()
    try:
        accelerator = Accelerator(cpu=True, gradient_accumulation_steps=2)
        model = TinyLM()
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
        model, optimizer = accelerator.prepare(model, optimizer)
        client = join(accelerator, model, optimizer, address, 0, timeouts=FAST, report_every=1e9)
        for _ in range(12):  # 12 micro-batches: 6 optimizer steps of 2 x (4 x 8) tokens
            with accelerator.accumulate(model):
                accelerator.backward(model(input_ids=torch.randint(0, 32, (4, 8))))
                optimizer.step()
                optimizer.zero_grad()
        assert client.steps == 6 and client.tokens == 6 * 64
        wait_for(lambda: sync.status()["merges"] > 0, 20, message="a merge of the Accelerate learner's work")
        stats = client.finish(timeout=10)
        assert stats["accepted"] > 0
        client.attachment.detach()
    finally:
        sync.stop()
