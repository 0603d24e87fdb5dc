from __future__ import annotations

from pathlib import Path

import pytest
import torch

from ddiloco.train.gpt import GPT
from ddiloco.train.tasks import MODELS, LanguageModelTask, Task, VisionTask, make_task


def test_unknown_model_lists_choices() -> None:
    with pytest.raises(ValueError) as err:
        make_task("resnet")
    for name in MODELS:
        assert name in str(err.value)
    with pytest.raises(ValueError, match="tiny"):
        make_task("gpt", model_size="huge")
    with pytest.raises(ValueError, match="tokenizer"):
        make_task("gpt", tokenizer="sentencepiece")


def test_lm_task_interface(shakespeare: str) -> None:
    task = make_task("gpt", shakespeare, model_size="tiny", seq_len=32)
    assert isinstance(task, Task) and isinstance(task, LanguageModelTask)
    assert task.name == "gpt"
    assert task.embedding_names == frozenset({"tok_emb.weight", "pos_emb.weight"})
    model = task.build_model(0)
    assert isinstance(model, GPT) and model.config.seq_len == 32 and model.config.vocab_size == 256
    assert task.embedding_names <= {n for n, _ in model.named_parameters()}
    assert make_task("gpt-moe", shakespeare, model_size="tiny", seq_len=32).name == "gpt-moe"
    # the encoded corpus is shared, not rebuilt, by tasks on the same data
    assert make_task("gpt-moe", shakespeare, model_size="tiny", seq_len=32).corpus is task.corpus
    info = task.describe()
    assert info["train_tokens"] + info["val_tokens"] == len(Path(shakespeare).read_bytes())


def test_lm_task_on_default_stdlib_corpus() -> None:
    task = make_task("gpt", None, model_size="tiny", seq_len=32)
    assert len(task.corpus.train) > 500_000
    loss = task.loss(task.build_model(0), task.stream(0, 8, 2, 0).next())
    assert 4.0 < float(loss.detach()) < 7.0  # ~ln(256) = 5.55 at initialisation


def test_bpe_task(shakespeare: str) -> None:
    task = make_task("gpt", shakespeare, tokenizer="bpe", bpe_vocab_size=512, model_size="tiny", seq_len=32)
    assert task.tokenizer.vocab_size == 512 and task.config.vocab_size == 512
    batch = task.stream(0, 2, 4, 0).next()
    assert int(batch.inputs.max()) < 512
    assert len(task.corpus.train) < 0.7 * 1_003_855  # BPE tokens are fewer than bytes


@pytest.mark.parametrize("name", ["gpt", "gpt-moe", "vision"])
def test_evaluate_deterministic_and_restores_mode(name: str, shakespeare: str) -> None:
    task = make_task(name, None if name == "vision" else shakespeare, model_size="tiny", seq_len=32)
    model = task.build_model(0)
    model.train()
    first = task.evaluate(model, max_batches=3, batch_size=16)
    assert model.training and all(m.training for m in model.modules())
    second = task.evaluate(model, max_batches=3, batch_size=16)
    assert first == second
    assert set(first) == ({"eval_loss", "eval_accuracy"} if name == "vision" else {"eval_loss"})
    assert 0.5 < first["eval_loss"] < 8.0
    model.eval()
    task.evaluate(model, max_batches=1)
    assert not model.training
    # max_batches really limits the set; None uses all of it
    assert task.evaluate(model, max_batches=1, batch_size=16) != task.evaluate(model, batch_size=16) or name == "vision"
    assert torch.is_grad_enabled()


def test_vision_task_interface() -> None:
    task = make_task("vision")
    assert isinstance(task, VisionTask) and task.name == "vision"
    assert task.embedding_names == frozenset()
    assert len(task.data.x_train) + len(task.data.x_val) == 1797
    assert len(task.data.x_val) == 360
    assert task.data.x_train.min() >= 0.0 and task.data.x_train.max() <= 1.0
    # the split is fixed: a second task holds the same validation images
    assert (make_task("vision").data.y_val == task.data.y_val).all()


def test_vision_torchvision_root_errors(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="does-not-exist"):
        make_task("vision", str(tmp_path / "does-not-exist"))
    try:
        import torchvision  # noqa: F401
    except ImportError:
        with pytest.raises(ImportError, match="torchvision"):
            make_task("vision", f"mnist:{tmp_path}")
    else:  # pragma: no cover - torchvision is not installed in this project's environment
        with pytest.raises(FileNotFoundError, match="mnist"):
            make_task("vision", f"mnist:{tmp_path}")


def test_larger_gpt_presets_have_the_parameter_counts_their_names_say() -> None:
    from ddiloco.train.tasks import gpt_config

    for size, millions in (("2m", 1.9), ("10m", 10.9), ("50m", 49.6)):
        with torch.device("meta"):  # counted, not allocated
            n = sum(p.numel() for p in GPT(gpt_config("gpt", size)).parameters())
        assert abs(n / 1e6 - millions) < 0.05, (size, n)
    with pytest.raises(ValueError, match="vision model comes in sizes"):
        make_task("vision", model_size="10m")
