"""`client.attach(optimizer)`: a training loop with no `client.step` in it, two learner processes.

    python examples/attach_optimizer.py                  # about a minute on 2 CPU cores
    python examples/attach_optimizer.py --tokens 40000   # a quick check
    python examples/attach_optimizer.py --data FILE      # your own text (a file or a folder)

For loops you do not write (a framework's) or would rather not touch: `attach` puts a step post-hook
on the inner optimizer, so every `optimizer.step()` is a `client.step` with `tokens_per_step` tokens.
The model and data are examples/own_model.py's; the loop below is a plain PyTorch loop with a
`torch.amp.GradScaler` (a step the scaler skips for an inf gradient is not counted). The lines that
know ddiloco end in `# ddiloco`. The script exits non-zero unless the run finished, both learners
exited cleanly, both learners' work was merged and the global model learned.
"""

from __future__ import annotations

import argparse
import sys

import torch
import torch.nn.functional as F
from own_model import BATCH, SEQ, CharWindows, TinyLM, eval_loss
from torch.utils.data import DataLoader

import ddiloco

from _launch import corpus_bytes, start_learners, wait_for_run


def learner(address: str, learner_id: int, learners: int, data_path: str | None) -> None:
    torch.set_num_threads(1)
    model = TinyLM()
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
    scaler = torch.amp.GradScaler("cpu")
    data = CharWindows(corpus_bytes(data_path))
    sampler = ddiloco.ResumableSampler(data, learner_id, learners, batch_size=BATCH)  # ddiloco
    with ddiloco.LearnerClient(model, address, learner_id) as client:  # ddiloco
        client.attach(optimizer, tokens_per_step=BATCH * SEQ)  # ddiloco
        sampler.seek(client.start_position)  # ddiloco
        for x, y in DataLoader(data, batch_size=BATCH, sampler=sampler):
            loss = F.cross_entropy(model(x).flatten(0, 1), y.flatten())
            scaler.scale(loss).backward()
            scaler.step(optimizer)  # the hook: client.step(tokens=BATCH * SEQ)
            scaler.update()
            optimizer.zero_grad()
            if client.stopping:  # ddiloco
                break


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tokens", type=int, default=200_000, help="token budget of the run")
    parser.add_argument("--data", default=None, help="a text file or folder (default: the Python stdlib's sources)")
    parser.add_argument("--learner", type=int, default=None, help=argparse.SUPPRESS)  # the learner processes
    parser.add_argument("--connect", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.learner is not None:
        learner(args.connect, args.learner, 2, args.data)
        return 0
    data = CharWindows(corpus_bytes(args.data))
    before = eval_loss(TinyLM(), data)
    sync = ddiloco.Synchronizer(TinyLM(), learners=2, tokens=args.tokens, sync_every=8, outer_momentum=0.0)
    address = sync.start()  # ddiloco
    data_args = [] if args.data is None else ["--data", args.data]
    cmd = [sys.executable, __file__, *data_args, "--connect", address, "--learner"]
    finished, codes = wait_for_run(sync, start_learners(cmd, 2))  # sync.wait, watching the learners
    books = sync.status()["books"]
    model = TinyLM()
    model.load_state_dict({n: t.clone() for n, t in sync.service.core.params.items()}, strict=False)
    sync.stop()  # ddiloco
    after = eval_loss(model, data)
    merged = all(books.get(str(m), {}).get("tokens_merged", 0) > 0 for m in range(2))
    print(
        f"run finished: {finished}; learners exited {codes}; both learners' work merged: {merged}; "
        f"eval loss {before:.3f} -> {after:.3f}"
    )
    return 0 if finished and codes == [0, 0] and merged and after < before - 0.5 else 1


if __name__ == "__main__":
    raise SystemExit(main())
