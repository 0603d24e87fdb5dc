"""A Lightning `Trainer` as a Decoupled DiLoCo learner: one callback, two learner processes.

    pip install -e '.[lightning]'
    python examples/lightning_trainer.py        # well under a minute on 2 CPU cores
    python examples/lightning_trainer.py --data FILE   # your own text (a file or a folder)

The learner is a plain Lightning script (a small byte-level language model on a text; with no
`--data`, the Python standard library's own sources) plus the lines that end in `# ddiloco`: the
callback creates the client when training starts, attaches it to the module's optimizer (every optimizer step is a
`client.step`, with the tokens of the batches since the step before), stops the Trainer when the
run's token budget is reached and finishes the client at the end. `main` starts the synchronizer in
this process and the two learners as child processes, and exits non-zero unless both learners'
work merged and the global model learned.
"""

from __future__ import annotations

import argparse
import sys

import lightning
import torch

import ddiloco
from ddiloco.integrations.lightning import DecoupledDiLoCo  # ddiloco

from _launch import corpus_bytes, start_learners, wait_for_run

SEQ = 33


class ByteLM(lightning.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.embed = torch.nn.Embedding(256, 64)
        self.mix = torch.nn.GRU(64, 64, batch_first=True)
        self.head = torch.nn.Linear(64, 256)

    def loss(self, batch: torch.Tensor) -> torch.Tensor:
        hidden, _ = self.mix(self.embed(batch[:, :-1]))
        return torch.nn.functional.cross_entropy(self.head(hidden).flatten(0, 1), batch[:, 1:].flatten())

    def training_step(self, batch: torch.Tensor, batch_idx: int) -> torch.Tensor:
        return self.loss(batch)

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.AdamW(self.parameters(), lr=3e-3)


def windows(data_path: str | None, part: int = 0, parts: int = 1) -> torch.Tensor:
    data = corpus_bytes(data_path)
    return torch.tensor([list(data[s : s + SEQ]) for s in range(part * SEQ, len(data) - SEQ, SEQ * parts)])


def learner(address: str, learner_id: int, data_path: str | None) -> None:
    torch.set_num_threads(1)
    loader = torch.utils.data.DataLoader(windows(data_path, learner_id, 2), batch_size=16, shuffle=True)
    trainer = lightning.Trainer(
        accelerator="cpu",
        max_steps=10_000,  # the run's token budget ends it first
        callbacks=[DecoupledDiLoCo(address, learner_id)],  # ddiloco
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    trainer.fit(ByteLM(), loader)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tokens", type=int, default=200_000, help="token budget of the run")
    parser.add_argument("--data", default=None, help="a text file or folder (default: the Python stdlib's sources)")
    parser.add_argument("--learner", type=int, default=None, help=argparse.SUPPRESS)  # the learner processes
    parser.add_argument("--connect", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.learner is not None:
        learner(args.connect, args.learner, args.data)
        return 0
    held_out = windows(args.data)[-64:]
    with torch.no_grad():
        before = float(ByteLM().loss(held_out))
    sync = ddiloco.Synchronizer(ByteLM(), learners=2, tokens=args.tokens, sync_every=8)
    address = sync.start()
    data_args = [] if args.data is None else ["--data", args.data]
    cmd = [sys.executable, __file__, *data_args, "--connect", address, "--learner"]
    finished, codes = wait_for_run(sync, start_learners(cmd, 2))  # sync.wait, watching the learners
    books = sync.status()["books"]
    model = ByteLM()
    model.load_state_dict({n: t.clone() for n, t in sync.service.core.params.items()})
    sync.stop()
    with torch.no_grad():
        after = float(model.loss(held_out))
    merged = all(books.get(str(m), {}).get("tokens_merged", 0) > 0 for m in range(2))
    print(f"run finished: {finished}; learners exited {codes}; both merged: {merged}; loss {before:.3f} -> {after:.3f}")
    return 0 if finished and codes == [0, 0] and merged and after < before - 0.5 else 1


if __name__ == "__main__":
    raise SystemExit(main())
