"""(f) DeepSpeed ZeRO is refused with a message that says why, before any training (no deepspeed
installed: its settings are faked on real TrainingArguments, an Accelerator's state, the environment)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from ddiloco.integrations.common import ZERO_REFUSED, TokenCounter, refuse_deepspeed, torch_optimizer

pytestmark = pytest.mark.timeout(60)


def test_deepspeed_in_the_trainer_is_refused_when_the_trainer_is_built(tmp_path):
    pytest.importorskip("transformers", reason="the Hugging Face extra: pip install -e '.[hf]'")
    pytest.importorskip("accelerate", reason="the Trainer needs accelerate: pip install -e '.[hf]'")
    from transformers import Trainer, TrainingArguments

    from ddiloco.integrations.transformers import DecoupledDiLoCoCallback

    args = TrainingArguments(output_dir=str(tmp_path), use_cpu=True, report_to=[])
    args.deepspeed = {"zero_optimization": {"stage": 2}}  # what `deepspeed=` would hold, without deepspeed
    callback = DecoupledDiLoCoCallback("127.0.0.1:1", learner_id=0)
    with pytest.raises(ValueError, match="DeepSpeed ZeRO") as refused:
        Trainer(model=torch.nn.Linear(2, 2), args=args, callbacks=[callback])
    assert "overwrites the module's parameters" in str(refused.value) and callback.client is None
    args.deepspeed = None
    callback.on_init_end(args, None, None)  # without it: accepted


def test_deepspeed_in_an_accelerator_or_the_environment_is_refused(monkeypatch):
    from ddiloco.integrations.accelerate import join

    accelerator = SimpleNamespace(state=SimpleNamespace(deepspeed_plugin=object()))
    with pytest.raises(ValueError, match="DeepSpeed ZeRO"):
        join(accelerator, torch.nn.Linear(2, 2), None, "127.0.0.1:1", 0)
    refuse_deepspeed(SimpleNamespace(deepspeed=None, deepspeed_plugin=None))
    monkeypatch.setenv("ACCELERATE_USE_DEEPSPEED", "true")
    with pytest.raises(ValueError) as refused:
        refuse_deepspeed()
    assert str(refused.value) == ZERO_REFUSED


def test_the_hook_goes_on_the_torch_optimizer_inside_a_wrapper():
    optimizer = torch.optim.SGD(torch.nn.Linear(2, 2).parameters(), lr=0.1)
    AcceleratedOptimizer = type("AcceleratedOptimizer", (torch.optim.Optimizer,), {})
    wrapper = AcceleratedOptimizer.__new__(AcceleratedOptimizer)
    wrapper.optimizer = optimizer
    assert torch_optimizer(wrapper) is optimizer and torch_optimizer(optimizer) is optimizer
    with pytest.raises(TypeError, match="torch.optim.Optimizer"):
        torch_optimizer(object())


def test_the_token_counter_counts_training_forward_passes_only():
    model = torch.nn.Embedding(16, 4)
    counter = TokenCounter(model)
    ids = torch.zeros(2, 8, dtype=torch.long)
    model(ids)
    model(input=ids)  # a keyword the counter does not count (token_key is input_ids)
    with torch.no_grad():
        model(ids)  # evaluation-style: not trained
    model.eval()
    model(ids)
    assert counter.take() == 16 and counter.take() == 0
    model.train()
    model(ids)
    counter.reset()  # a step the scaler skipped
    assert counter.take() == 0 and counter.total == 16
    counter.remove()
    model(ids)
    assert counter.pending == 0


def test_fsdp1_is_refused_and_fsdp2_accepted(tmp_path):
    """FSDP1 flattens parameters into per-rank FlatParameters: refused from the Trainer's arguments (before
    training) and from the model a framework hands over; FSDP2 (the Trainer's default) is accepted."""
    from ddiloco.integrations.common import FSDP1_REFUSED, refuse_fsdp1

    with pytest.raises(ValueError) as refused:
        refuse_fsdp1(SimpleNamespace(fsdp=True, fsdp_config={"version": 1}))
    assert str(refused.value) == FSDP1_REFUSED
    refuse_fsdp1(SimpleNamespace(fsdp=True, fsdp_config={"version": 2}))
    refuse_fsdp1(SimpleNamespace(fsdp=None, fsdp_config={"version": 1}))  # FSDP off: its config is unused
    FullyShardedDataParallel = type("FullyShardedDataParallel", (torch.nn.Module,), {})
    wrapped = torch.nn.Sequential(torch.nn.Linear(2, 2), FullyShardedDataParallel())
    with pytest.raises(ValueError, match="not FSDP1"):
        refuse_fsdp1(model=wrapped)
    refuse_fsdp1(model=torch.nn.Sequential(torch.nn.Linear(2, 2)))
    pytest.importorskip("transformers", reason="the Hugging Face extra: pip install -e '.[hf]'")
    from transformers import TrainingArguments

    from ddiloco.integrations.transformers import DecoupledDiLoCoCallback

    args = TrainingArguments(output_dir=str(tmp_path), use_cpu=True, report_to=[])
    args.fsdp, args.fsdp_config = True, {"version": 1}  # what fsdp_config={"fsdp_version": 1} leaves there
    with pytest.raises(ValueError, match="not FSDP1"):
        DecoupledDiLoCoCallback("127.0.0.1:1", learner_id=0).on_init_end(args, None, None)
