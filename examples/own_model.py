"""Your own PyTorch model and DataLoader, trained by Decoupled DiLoCo with two learner processes.

    python examples/own_model.py                  # about a minute on 2 CPU cores
    python examples/own_model.py --tokens 40000   # a quick check
    python examples/own_model.py --data FILE      # your own text (a file or a folder)

The model (a small character-level transformer whose output layer is tied to its embedding) and the
data (windows of a text's bytes through a plain DataLoader with a worker; with no `--data`, the Python
standard library's own sources, which every machine with Python has) know
nothing of ddiloco. The lines that do end in `# ddiloco`: that is all the glue. The script starts a
synchronizer in this process, two learner processes that join it over loopback, waits for the token
budget, exports the global model and loads it back into a fresh model; it exits non-zero if the
reloaded model differs from the exported parameters or did not learn.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader, Dataset

import ddiloco

from _launch import corpus_bytes, start_learners, wait_for_run

SEQ, BATCH = 64, 16


class CharWindows(Dataset):
    """Non-overlapping windows of a text, bytes as tokens."""

    def __init__(self, text: bytes, seq: int = SEQ) -> None:
        self.data = torch.tensor(list(text), dtype=torch.long)
        self.seq = seq

    def __len__(self) -> int:
        return (len(self.data) - 1) // self.seq

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        chunk = self.data[i * self.seq : (i + 1) * self.seq + 1]
        return chunk[:-1], chunk[1:]


class TinyLM(torch.nn.Module):
    def __init__(self, vocab: int = 256, dim: int = 64) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.embed = torch.nn.Embedding(vocab, dim)
        torch.nn.init.normal_(self.embed.weight, std=0.02)
        self.pos = torch.nn.Parameter(torch.zeros(SEQ, dim))
        self.block = torch.nn.TransformerEncoderLayer(dim, 4, 4 * dim, dropout=0.0, batch_first=True, norm_first=True)
        self.norm = torch.nn.LayerNorm(dim)
        self.head = torch.nn.Linear(dim, vocab, bias=False)
        self.head.weight = self.embed.weight  # tied

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        mask = torch.nn.Transformer.generate_square_subsequent_mask(x.shape[1])
        return self.head(self.norm(self.block(self.embed(x) + self.pos[: x.shape[1]], src_mask=mask, is_causal=True)))


def eval_loss(model: torch.nn.Module, data: Dataset, batches: int = 8) -> float:
    with torch.no_grad():
        x, y = next(iter(DataLoader(data, batch_size=BATCH * batches)))
        return float(F.cross_entropy(model(x).flatten(0, 1), y.flatten()))


def learner(address: str, learner_id: int, learners: int, data_path: str | None) -> None:
    torch.set_num_threads(1)
    ddiloco.log_to_stderr()  # joins, progress every 30 s, rejections  # ddiloco
    model = TinyLM()
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
    data = CharWindows(corpus_bytes(data_path))
    sampler = ddiloco.ResumableSampler(data, learner_id, learners, batch_size=BATCH)  # ddiloco
    # forkserver: the client's gRPC threads are running when the loader starts its worker
    loader = DataLoader(data, batch_size=BATCH, sampler=sampler, num_workers=1, multiprocessing_context="forkserver")
    with ddiloco.LearnerClient(model, address, learner_id) as client:  # ddiloco
        sampler.seek(client.start_position)  # ddiloco
        for x, y in loader:
            loss = F.cross_entropy(model(x).flatten(0, 1), y.flatten())
            loss.backward()
            optimizer.step()
            optimizer.zero_grad()
            client.step(tokens=y.numel(), loss=loss.item())  # ddiloco
            if client.stopping:  # ddiloco
                break


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tokens", type=int, default=300_000, help="token budget of the run")
    parser.add_argument("--out", type=Path, default=None, help="where the checkpoint and the export go")
    parser.add_argument("--data", default=None, help="a text file or folder (default: the Python stdlib's sources)")
    parser.add_argument("--learner", type=int, default=None, help=argparse.SUPPRESS)  # the learner processes
    parser.add_argument("--connect", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.learner is not None:
        learner(args.connect, args.learner, 2, args.data)
        return 0
    out = args.out or Path(tempfile.mkdtemp(prefix="ddiloco-example-"))
    data = CharWindows(corpus_bytes(args.data))
    before = eval_loss(TinyLM(), data)
    sync = ddiloco.Synchronizer(
        TinyLM(),
        learners=2,
        tokens=args.tokens,
        checkpoint_dir=out / "ckpt",  # ddiloco
        sync_every=8,
        overlap=1,
        outer_lr=1.0,
        outer_momentum=0.0,
    )
    address = sync.start()  # ddiloco
    data_args = [] if args.data is None else ["--data", args.data]
    learners = start_learners([sys.executable, __file__, *data_args, "--connect", address, "--learner"], 2)
    finished, codes = wait_for_run(sync, learners)  # sync.wait(timeout=...) while watching the learners
    sync.stop()  # ddiloco
    weights = ddiloco.export_global(out / "ckpt", out / "export")  # ddiloco
    model = TinyLM()
    from safetensors.torch import load_file, load_model

    load_model(model, str(weights))  # tied weights: the file holds the embedding once
    exported = load_file(str(weights))
    same = all(torch.equal(p.detach(), exported[n]) for n, p in model.named_parameters())
    after = eval_loss(model, data)
    print(
        f"run finished: {finished}; learners exited {codes}; eval loss {before:.3f} -> {after:.3f}; "
        f"reloaded model equals the export: {same}; export: {weights}"
    )
    return 0 if finished and codes == [0, 0] and same and after < before - 0.5 else 1


if __name__ == "__main__":
    raise SystemExit(main())
