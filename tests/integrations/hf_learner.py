"""A Hugging Face `Trainer` learner for the integration tests: a tiny `LlamaForCausalLM` from a config
(nothing downloaded) on local text, run as `python hf_learner.py ...` or under torchrun. Each rank
writes what it trained and counted to OUT/rank-<rank>.json."""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import sys
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_NO_ADVISORY_WARNINGS", "1")

import torch  # noqa: E402
from transformers import LlamaConfig, LlamaForCausalLM, Trainer, TrainerCallback, TrainingArguments  # noqa: E402

SEQ, BATCH = 32, 4
CONFIG = dict(
    vocab_size=256,
    hidden_size=32,
    intermediate_size=64,
    num_hidden_layers=1,
    num_attention_heads=2,
    num_key_value_heads=1,
    max_position_embeddings=SEQ,
    tie_word_embeddings=True,
)


def build() -> LlamaForCausalLM:
    torch.manual_seed(0)
    return LlamaForCausalLM(LlamaConfig(**CONFIG))


class Windows(torch.utils.data.Dataset):
    """Windows of SEQ bytes of the text (bytes as tokens), learner `part` of `parts`."""

    def __init__(self, path: str, part: int = 0, parts: int = 1, limit: int = 4096) -> None:
        data = Path(path).read_bytes()
        starts = list(range(part * SEQ, len(data) - SEQ, SEQ * parts))[:limit]
        self.ids = torch.tensor([list(data[s : s + SEQ]) for s in starts], dtype=torch.long)

    def __len__(self) -> int:
        return len(self.ids)

    def __getitem__(self, i: int) -> dict:
        return {"input_ids": self.ids[i], "labels": self.ids[i]}


def fsdp_arguments() -> dict:
    """FSDP2 through Accelerate (Transformers' default FSDP version), each decoder layer its own unit."""
    return dict(
        fsdp=True,  # full sharding (reshard_after_forward); the string "full_shard" is deprecated
        fsdp_config={
            "version": 2,
            "auto_wrap_policy": "TRANSFORMER_BASED_WRAP",
            "transformer_layer_cls_to_wrap": ["LlamaDecoderLayer"],
            "reshard_after_forward": True,
        },
    )


def fsdp_on_cpu() -> None:
    """Let Accelerate run its FSDP2 path on the CPU (gloo). Accelerate 1.16 turns FSDP on only for GPU-like
    device types (`AcceleratorState.__init__`, accelerate/state.py: `DistributedType.FSDP` is set only when
    the type is MULTI_GPU, MULTI_XPU, ...), so with `use_cpu=True` it drops the Trainer's FSDP plugin
    without a word and trains with DDP. Here the Accelerator the Trainer builds takes the plugin anyway:
    everything after that (`fsdp2_prepare_model`: `fully_shard` per decoder layer and on the model, the
    optimizer's parameters swapped for the DTensor ones, clipping, the Trainer's FSDP branches) is
    Accelerate's and the Trainer's own code, which runs on the CPU as `fully_shard` does (tests/learner/
    test_fsdp.py). On GPUs none of this is needed."""
    import accelerate
    import transformers.trainer
    from accelerate.utils import DistributedType

    class Accelerator(accelerate.Accelerator):
        def __init__(self, *args, fsdp_plugin=None, **kwargs) -> None:
            super().__init__(*args, fsdp_plugin=fsdp_plugin, **kwargs)
            if fsdp_plugin is not None and self.state.distributed_type == DistributedType.MULTI_CPU:
                self.state.distributed_type = DistributedType.FSDP
                self.state.fsdp_plugin = fsdp_plugin

    transformers.trainer.Accelerator = Accelerator  # type: ignore[misc]


def arguments(out: str, max_steps: int, save_steps: int = 0, seed: int = 0, fsdp: bool = False) -> TrainingArguments:
    return TrainingArguments(
        output_dir=out,
        use_cpu=True,
        per_device_train_batch_size=BATCH,
        max_steps=max_steps,
        learning_rate=3e-3,
        lr_scheduler_type="constant",
        logging_steps=1,
        save_strategy="steps" if save_steps else "no",
        save_steps=save_steps or 500,
        report_to=[],
        seed=seed,
        dataloader_num_workers=0,
        include_num_input_tokens_seen="all",
        disable_tqdm=True,
        **(fsdp_arguments() if fsdp else {}),
    )


def full_parameters(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """Every parameter whole: FSDP2's sharded ones (DTensor) gathered, on every rank (collective)."""
    from torch.distributed.tensor import DTensor

    out = {}
    for name, p in sorted(model.named_parameters()):
        t = p.detach()
        out[name] = (t.full_tensor() if isinstance(t, DTensor) else t).float().contiguous()
    return out


def digest(model: torch.nn.Module) -> str:
    h = hashlib.sha256()
    for name, t in full_parameters(model).items():
        h.update(name.encode())
        h.update(t.numpy().tobytes())
    return h.hexdigest()


class WaitForLearners(TrainerCallback):
    """After ddiloco's callback joined, wait (bounded) until `n` learners have registered, so that a test
    that needs every learner's work is not decided by which process started faster."""

    def __init__(self, address: str, n: int) -> None:
        self.address, self.n = address, n

    def on_train_begin(self, args, state, control, **kwargs):
        from ddiloco.api.control import shard_status

        deadline = time.monotonic() + 120
        while len(shard_status(self.address)["learners"]) < self.n and time.monotonic() < deadline:
            time.sleep(0.1)


def main() -> int:
    from ddiloco.integrations.transformers import DecoupledDiLoCoCallback, last_checkpoint

    parser = argparse.ArgumentParser()
    parser.add_argument("--connect", default=None)
    parser.add_argument("--id", type=int, default=0)
    parser.add_argument("--data", required=True)
    parser.add_argument("--out", required=True)
    parser.add_argument("--max-steps", type=int, default=200)
    parser.add_argument("--save-steps", type=int, default=0)
    parser.add_argument("--resume", action="store_true")
    parser.add_argument("--codec", default="bf16", help="how contributions travel (fp32: exact)")
    parser.add_argument("--fsdp", action="store_true", help="FSDP2 (full_shard) through the Trainer's Accelerate")
    parser.add_argument("--wait-learners", type=int, default=0, help="before the first step: until N have joined")
    args = parser.parse_args()
    torch.set_num_threads(1)
    model = build()
    if args.fsdp:
        fsdp_on_cpu()
    callbacks = (
        [DecoupledDiLoCoCallback(args.connect, args.id, codec=args.codec, report_every=1e9)] if args.connect else []
    )
    if args.wait_learners:
        callbacks.append(WaitForLearners(args.connect, args.wait_learners))
    trainer = Trainer(
        model=model,
        args=arguments(args.out, args.max_steps, args.save_steps, fsdp=args.fsdp),
        train_dataset=Windows(args.data, args.id, 2),
        callbacks=callbacks,
    )
    resume = last_checkpoint(args.out) if args.resume else None
    trainer.train(resume_from_checkpoint=resume)
    rank = int(os.environ.get("RANK", "0"))
    stats = callbacks[0].stats() if callbacks else {}
    result = {
        "rank": rank,
        "world": int(os.environ.get("WORLD_SIZE", "1")),
        "global_step": trainer.state.global_step,
        "resumed_from": resume,
        "tokens_seen": int(trainer.state.num_input_tokens_seen),
        "losses": [h["loss"] for h in trainer.state.log_history if "loss" in h],
        "client": {k: stats.get(k) for k in ("steps", "tokens", "accepted", "pushed", "registrations")},
        "params_sha": digest(model),
        "sharded": sorted(n for n, p in model.named_parameters() if type(p).__name__ == "DTensor"),
        "fsdp_module": type(trainer.model).__name__,
    }
    Path(args.out, f"rank-{rank}.json").write_text(json.dumps(result))
    if torch.distributed.is_initialized():
        # Accelerate's gloo group, ended by every rank together before the interpreter: a rank that left
        # (or destroyed it) while another was still in it made that one's gloo threads die joinable now
        # and then ("terminate called without an active exception", SIGABRT), as test_hook.py saw too
        torch.distributed.barrier()
        torch.distributed.destroy_process_group()
        # as fsdp_learner.py and `ddiloco learner`: skip the interpreter's finalization, during which a
        # rank that had written its results hung until torchrun's agent was killed (one loaded run)
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(0)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
