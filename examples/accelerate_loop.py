"""An `Accelerator` training loop (no Trainer) as a Decoupled DiLoCo learner, two learner processes.

    pip install -e '.[hf]'
    python examples/accelerate_loop.py          # well under a minute on 2 CPU cores
    python examples/accelerate_loop.py --data FILE   # your own text (a file or a folder)
    accelerate launch --num_processes 2 ...     # the learner part works the same under DDP

The loop is Accelerate's own (`prepare`, `accumulate`, `backward`) plus the lines that end in
`# ddiloco`: `join` creates and starts the client on the unwrapped model and attaches it to the torch
optimizer inside Accelerate's wrapper, so each real optimizer step (not each accumulation micro-step,
not a step the grad scaler skipped) is a `client.step` with the tokens of its micro-batches.
"""

from __future__ import annotations

import argparse
import os
import sys

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # local files only: nothing is fetched

import torch  # noqa: E402
from accelerate import Accelerator  # noqa: E402
from transformers import LlamaConfig, LlamaForCausalLM  # noqa: E402

import ddiloco  # noqa: E402
from ddiloco.integrations.accelerate import join  # noqa: E402  # ddiloco

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


def build() -> LlamaForCausalLM:
    torch.manual_seed(0)
    return LlamaForCausalLM(CONFIG)


def learner(address: str, learner_id: int, data_path: str | None) -> None:
    torch.set_num_threads(1)
    data = corpus_bytes(data_path)
    ids = torch.tensor([list(data[s : s + SEQ]) for s in range(learner_id * SEQ, len(data) - SEQ, 2 * SEQ)])
    loader = torch.utils.data.DataLoader(ids, batch_size=8, shuffle=True)
    accelerator = Accelerator(cpu=not torch.cuda.is_available(), gradient_accumulation_steps=2)
    model = build()
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
    model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
    client = join(accelerator, model, optimizer, address, learner_id)  # ddiloco
    for batch in loader:
        with accelerator.accumulate(model):
            accelerator.backward(model(input_ids=batch, labels=batch).loss)
            optimizer.step()
            optimizer.zero_grad()
        if client.stopping:  # ddiloco
            break
    stats = client.finish()  # ddiloco
    print(f"learner {learner_id}: {stats['steps']} optimizer steps, {stats['tokens']} tokens")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tokens", type=int, default=100_000, help="token budget of the run")
    parser.add_argument("--data", default=None, help="a text file or folder (default: the Python stdlib's sources)")
    parser.add_argument("--learner", type=int, default=None, help=argparse.SUPPRESS)  # the learner processes
    parser.add_argument("--connect", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.learner is not None:
        learner(args.connect, args.learner, args.data)
        return 0
    sync = ddiloco.Synchronizer(build(), learners=2, tokens=args.tokens, sync_every=8)
    address = sync.start()
    data_args = [] if args.data is None else ["--data", args.data]
    cmd = [sys.executable, __file__, *data_args, "--connect", address, "--learner"]
    finished, codes = wait_for_run(sync, start_learners(cmd, 2))  # sync.wait, watching the learners
    books = sync.status()["books"]
    sync.stop()
    merged = all(books.get(str(m), {}).get("tokens_merged", 0) > 0 for m in range(2))
    print(f"run finished: {finished}; learners exited {codes}; both learners' work merged: {merged}")
    return 0 if finished and codes == [0, 0] and merged else 1


if __name__ == "__main__":
    raise SystemExit(main())
