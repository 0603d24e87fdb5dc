"""torchtitan on the CPU: the config function, the fragments from module names on the debug model built
on the meta device, the refusals, and the trainer's join / step / stop glue against a real synchronizer
(without building torchtitan's whole Trainer, which needs a GPU-capable setup and its tokenizer assets).
End to end (torchtitan's own loop on the debug model) needs a GPU: not run here."""

from __future__ import annotations

import time

import pytest
import torch

try:
    import torchtitan  # noqa: F401  (0.3 imports triton, which CPU builds of torch do not bring)
except ImportError as exc:  # pragma: no cover - depends on the environment
    pytest.skip(f"torchtitan not importable ({exc}): pip install -e '.[torchtitan]'", allow_module_level=True)

from torchtitan.distributed.pipeline_parallel import _generate_llm_fqn_per_model_part  # noqa: E402
from torchtitan.models.llama3 import model_registry  # noqa: E402
from torchtitan.models.llama3.config_registry import llama3_debugmodel  # noqa: E402

import ddiloco  # noqa: E402
from ddiloco.integrations import torchtitan as tt  # noqa: E402

from ..support.runtime import wait_for  # noqa: E402

pytestmark = pytest.mark.timeout(120)


@pytest.fixture(scope="module")
def debug_model() -> torch.nn.Module:
    with torch.device("meta"):
        return model_registry("debugmodel").model.build()


def test_the_config_function_is_the_debug_models_with_a_ddiloco_section():
    config = tt.llama3_ddiloco_debugmodel()
    base = llama3_debugmodel()
    assert isinstance(config, tt.DecoupledDiLoCoTrainer.Config) and type(config)._owner is tt.DecoupledDiLoCoTrainer
    assert config.model_spec.flavor == "debugmodel" and config.training.seq_len == base.training.seq_len
    assert config.ddiloco == tt.DecoupledDiLoCoSettings() and config.training.steps == 1_000_000


def test_the_config_is_reached_from_torchtitans_command_line():
    from torchtitan.config import ConfigManager

    argv = ["--module", "ddiloco.integrations.torchtitan", "--config", "llama3_ddiloco_debugmodel"]
    config = ConfigManager().parse_args([*argv, "--ddiloco.address", "10.0.0.5:7070", "--ddiloco.learner-id", "3"])
    assert isinstance(config, tt.DecoupledDiLoCoTrainer.Config)
    assert config.ddiloco.address == "10.0.0.5:7070" and config.ddiloco.learner_id == 3


@pytest.mark.parametrize("fragments", range(1, 9))
def test_fragments_from_module_names_are_torchfts_on_the_debug_model(debug_model, fragments):
    modules = tt.module_fragments(debug_model, fragments)
    assert modules == _generate_llm_fqn_per_model_part(fragments, 6, 1, 1)
    params = tt.parameter_fragments(debug_model, modules)
    names = [n for n, _ in debug_model.named_parameters()]
    assert sorted(n for f in params for n in f) == sorted(names)  # every parameter, exactly once
    for f, members in enumerate(params):
        assert all(n.split(".")[0] in {m.split(".")[0] for m in modules[f]} for n in members)
    assert params[0][0] == "tok_embeddings.weight" and "lm_head.weight" in params[-1]


def test_wrapped_layers_keep_their_plain_names(debug_model):
    from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import checkpoint_wrapper

    with torch.device("meta"):
        wrapped = model_registry("debugmodel").model.build()
    for key, layer in list(wrapped.layers.named_children()):
        wrapped.layers.register_module(key, checkpoint_wrapper(layer))
    raw = [n for n, _ in wrapped.named_parameters()]
    assert any("_checkpoint_wrapped_module" in n for n in raw)
    assert [tt.clean_name(n) for n in raw] == [n for n, _ in debug_model.named_parameters()]
    modules = tt.module_fragments(wrapped, 3)
    assert tt.parameter_fragments(wrapped, modules) == tt.parameter_fragments(debug_model, modules)
    with pytest.raises(ValueError, match="fragments for 8 units"):
        tt.module_fragments(debug_model, 9)


def test_parallelisms_other_than_data_parallel_are_refused():
    config = tt.llama3_ddiloco_debugmodel()
    tt.refuse_unsupported(config, 8)  # FSDP over all ranks: fine
    config.parallelism.tensor_parallel_degree = 2
    with pytest.raises(ValueError, match=r"\['tensor'\] parallel"):
        tt.refuse_unsupported(config, 8)
    config.parallelism.tensor_parallel_degree = 1
    config.parallelism.data_parallel_replicate_degree = 2
    with pytest.raises(ValueError, match="HSDP"):
        tt.refuse_unsupported(config, 8)
    with pytest.raises(ValueError, match="ddiloco.address"):
        tt.DecoupledDiLoCoTrainer(tt.llama3_ddiloco_debugmodel())


def test_the_trainer_joins_after_loading_counts_each_optimizer_step_and_stops_at_the_budget():
    """The trainer's own methods on a stand-in for what torchtitan's __init__ builds (model parts,
    optimizers, accumulation steps): join at the first should_continue_training, one client step per
    optimizers.step(), stop when the synchronizer's budget is reached."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1))
    tokens = 2 * 16 * 2  # local batch 2, sequence 16, 2 accumulation steps
    sync = ddiloco.Synchronizer(
        model, learners=1, tokens=30 * tokens, sync_every=4, overlap=1, quorum=1, grace=0.0, heartbeat=0.1
    )
    address = sync.start()
    try:
        trainer = tt.DecoupledDiLoCoTrainer.__new__(tt.DecoupledDiLoCoTrainer)
        trainer.config = tt.with_ddiloco(llama3_debugmodel(), address=address, learner_id=0)
        training = trainer.config.training
        training.local_batch_size, training.seq_len, training.steps = 2, 16, 10**6
        trainer.model_parts = [model]
        trainer.optimizers = torch.optim.SGD(model.parameters(), lr=1e-2)
        trainer.gradient_accumulation_steps, trainer.step = 2, 0
        trainer.client = trainer.attachment = None
        steps = 0
        while trainer.should_continue_training() and steps < 500:
            model(torch.randn(4, 8)).pow(2).mean().backward()
            trainer.optimizers.step()
            trainer.optimizers.zero_grad()
            trainer.step = steps = steps + 1
            time.sleep(0.01)  # the budget's news comes with heartbeats: leave it time to arrive
        assert trainer.client is not None and trainer.client.stopping and steps < 500
        assert trainer.client.steps == steps and trainer.client.tokens == steps * tokens
        wait_for(lambda: sync.status()["merges"] > 0, 20, message="merges of the trainer's work")
        trainer.client.finish(timeout=10)
    finally:
        sync.stop()
