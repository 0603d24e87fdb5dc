"""A Hugging Face `Trainer` as a Decoupled DiLoCo learner: one callback, two learner processes.

    pip install -e '.[hf]'
    python examples/hf_trainer.py               # about a minute on 2 CPU cores
    python examples/hf_trainer.py --ranks 2     # each learner a torchrun job of 2 ranks (DDP, gloo)
    python examples/hf_trainer.py --data FILE   # your own text (a file or a folder)

The learner is a plain Trainer script (a `LlamaForCausalLM` from a small config, nothing downloaded,
a text as bytes: with no `--data`, the Python standard library's own sources) plus the lines that end
in `# ddiloco`: the callback creates the client when training begins, attaches it to the Trainer's
optimizer (every optimizer step is a `client.step`), stops the Trainer when the run's token budget is
reached and finishes the client at the end. Run the same learner command again after a crash: it
resumes from its newest whole checkpoint and rejoins. `main` starts the synchronizer in this process
(as examples/own_model.py does) and the two learners as child processes, and exits non-zero unless
both learners' work merged.

FSDP2 (on GPUs, under torchrun or `accelerate launch`) needs no other `# ddiloco` line, only the
Trainer's own arguments: `TrainingArguments(..., fsdp=True, fsdp_config={"version": 2,
"auto_wrap_policy": "TRANSFORMER_BASED_WRAP", "transformer_layer_cls_to_wrap": ["LlamaDecoderLayer"]})`.
Accelerate does not shard on the CPU (it trains with DDP there); docs/api.md says why and how it is tested.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # local files only: nothing is fetched

import torch  # noqa: E402
from transformers import LlamaConfig, LlamaForCausalLM, Trainer, TrainingArguments  # noqa: E402

import ddiloco  # noqa: E402
from ddiloco.integrations.transformers import DecoupledDiLoCoCallback, last_checkpoint  # noqa: E402  # ddiloco

from _launch import corpus_bytes, start_learners, wait_for_run  # noqa: E402

SEQ = 64
CONFIG = LlamaConfig(
    vocab_size=256,
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=SEQ,
    tie_word_embeddings=True,
)


class Windows(torch.utils.data.Dataset):
    """Windows of SEQ bytes of the text: learner `part` of `parts` reads every parts-th window."""

    def __init__(self, data_path: str | None, part: int, parts: int) -> None:
        data = corpus_bytes(data_path)
        self.ids = torch.tensor([list(data[s : s + SEQ]) for s in range(part * SEQ, len(data) - SEQ, SEQ * parts)])

    def __len__(self) -> int:
        return len(self.ids)

    def __getitem__(self, i: int) -> dict:
        return {"input_ids": self.ids[i], "labels": self.ids[i]}


def build() -> LlamaForCausalLM:
    torch.manual_seed(0)
    return LlamaForCausalLM(CONFIG)


def learner(address: str, learner_id: int, out: Path, data_path: str | None) -> None:
    torch.set_num_threads(1)
    args = TrainingArguments(
        output_dir=str(out),
        use_cpu=not torch.cuda.is_available(),
        per_device_train_batch_size=8,
        learning_rate=3e-3,
        max_steps=10_000,  # the run's token budget ends it first
        save_steps=20,
        logging_steps=10,
        report_to=[],
        disable_tqdm=True,
    )
    callback = DecoupledDiLoCoCallback(address, learner_id)  # ddiloco
    data = Windows(data_path, learner_id, 2)
    trainer = Trainer(build(), args, train_dataset=data, callbacks=[callback])  # ddiloco
    trainer.train(resume_from_checkpoint=last_checkpoint(out))  # ddiloco
    if int(os.environ.get("RANK", "0")) == 0:
        print(f"learner {learner_id}: {callback.stats()['steps']} steps, {callback.stats()['tokens']} tokens")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tokens", type=int, default=120_000, help="token budget of the run")
    parser.add_argument("--out", type=Path, default=None, help="where checkpoints go")
    parser.add_argument("--ranks", type=int, default=1, help="processes per learner (torchrun, DDP)")
    parser.add_argument("--data", default=None, help="a text file or folder (default: the Python stdlib's sources)")
    parser.add_argument("--learner", type=int, default=None, help=argparse.SUPPRESS)  # the learner processes
    parser.add_argument("--connect", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    out = args.out or Path(tempfile.mkdtemp(prefix="ddiloco-trainer-"))
    if args.learner is not None:
        learner(args.connect, args.learner, out / f"learner-{args.learner}", args.data)
        ddiloco.end_ranks(0)  # under torchrun the ranks leave their group together  # ddiloco
    sync = ddiloco.Synchronizer(build(), learners=2, tokens=args.tokens, checkpoint_dir=out / "ckpt", sync_every=8)
    address = sync.start()
    launch = [sys.executable]
    if args.ranks > 1:
        torchrun = shutil.which("torchrun") or str(Path(sys.executable).with_name("torchrun"))
        launch = [torchrun, "--standalone", "--nproc-per-node", str(args.ranks)]
    data_args = [] if args.data is None else ["--data", args.data]
    cmd = [*launch, __file__, *data_args, "--out", str(out), "--connect", address, "--learner"]
    finished, codes = wait_for_run(sync, start_learners(cmd, 2))  # sync.wait, watching the learners
    books = sync.status()["books"]
    sync.stop()
    merged = all(books.get(str(m), {}).get("tokens_merged", 0) > 0 for m in range(2))
    print(f"run finished: {finished}; learners exited {codes}; both learners' work merged: {merged}")
    return 0 if finished and codes == [0, 0] and merged else 1


if __name__ == "__main__":
    raise SystemExit(main())
