"""A Hugging Face causal LM, trained by Decoupled DiLoCo with two learner processes, exported, reloaded.

    pip install -e '.[hf]'
    python examples/hf_causal_lm.py               # under a minute on 2 CPU cores
    python examples/hf_causal_lm.py --ranks 2     # each learner a torchrun job of 2 ranks, FSDP2-sharded
    python examples/hf_causal_lm.py --data FILE   # your own text (a file or a folder)

A `LlamaForCausalLM` built from a small `LlamaConfig` (random weights, nothing downloaded, output
layer tied to the embedding) learns a text through a `datasets` dataset built from it (bytes as
tokens, no tokenizer download; with no `--data`, the Python standard library's own sources). The
lines that know ddiloco end in `# ddiloco`. At the end the global model is exported as a folder that
`from_pretrained` loads; the script exits non-zero if the reloaded model differs from the exported
parameters or did not learn.

With `--ranks 2` each learner is `torchrun --nproc-per-node 2` running the same loop: the model is
sharded with FSDP2's `fully_shard` (gloo here, NCCL on GPUs), every rank reads its own share of the
learner's data, and the client on every rank keeps its own shards in step with the synchronizer.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # local files only: nothing is fetched
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
from datasets import Dataset  # noqa: E402
from torch.utils.data import DataLoader  # noqa: E402
from transformers import LlamaConfig, LlamaForCausalLM  # noqa: E402

import ddiloco  # noqa: E402

from _launch import corpus_bytes, start_learners, wait_for_run  # noqa: E402

SEQ, BATCH = 64, 8
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


def dataset(path: str | None) -> Dataset:
    """Windows of SEQ + 1 bytes of the text, as a map-style `datasets.Dataset` of token ids."""
    data = corpus_bytes(path)
    windows = [list(data[i : i + SEQ + 1]) for i in range(0, len(data) - SEQ - 1, SEQ)]
    return Dataset.from_dict({"ids": windows}).with_format("torch")


def build() -> LlamaForCausalLM:
    torch.manual_seed(0)
    return LlamaForCausalLM(CONFIG)


def eval_loss(model: LlamaForCausalLM, data: Dataset) -> float:
    with torch.no_grad():
        ids = data[:64]["ids"]
        return float(model(input_ids=ids, labels=ids).loss)


def shard(model: LlamaForCausalLM) -> tuple[int, int]:
    """Under torchrun: FSDP2 over this learner's ranks (each decoder layer, then the rest)."""
    if int(os.environ.get("WORLD_SIZE", "1")) == 1:
        return 0, 1
    from torch.distributed.fsdp import fully_shard

    dist.init_process_group("nccl" if torch.cuda.is_available() else "gloo")
    for layer in model.model.layers:
        fully_shard(layer)
    fully_shard(model)
    return dist.get_rank(), dist.get_world_size()


def learner(address: str, learner_id: int, learners: int, data_path: str | None) -> None:
    torch.set_num_threads(1)
    ddiloco.log_to_stderr()  # joins, progress every 30 s, rejections  # ddiloco
    model, data = build(), dataset(data_path)
    rank, world = shard(model)
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
    sampler = ddiloco.ResumableSampler(data, learner_id, learners, BATCH, rank=rank, world=world)  # ddiloco
    loader = DataLoader(data, batch_size=BATCH, sampler=sampler)
    with ddiloco.LearnerClient(model, address, learner_id) as client:  # ddiloco
        sampler.seek(client.start_position)  # ddiloco
        for batch in loader:
            loss = model(input_ids=batch["ids"], labels=batch["ids"]).loss
            loss.backward()
            optimizer.step()
            optimizer.zero_grad()
            client.step(tokens=batch["ids"].numel(), loss=loss.item())  # ddiloco
            if client.stopping:  # ddiloco
                break


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tokens", type=int, default=150_000, help="token budget of the run")
    parser.add_argument("--out", type=Path, default=None, help="where the checkpoint and the export go")
    parser.add_argument("--ranks", type=int, default=1, help="processes per learner (torchrun, FSDP2)")
    parser.add_argument("--data", default=None, help="a text file or folder (default: the Python stdlib's sources)")
    parser.add_argument("--learner", type=int, default=None, help=argparse.SUPPRESS)  # the learner processes
    parser.add_argument("--connect", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.learner is not None:
        learner(args.connect, args.learner, 2, args.data)
        ddiloco.end_ranks(0)  # the ranks leave their group together and skip finalization  # ddiloco
    out = args.out or Path(tempfile.mkdtemp(prefix="ddiloco-hf-"))
    data = dataset(args.data)
    before = eval_loss(build(), data)
    sync = ddiloco.Synchronizer(
        build(),
        learners=2,
        tokens=args.tokens,
        checkpoint_dir=out / "ckpt",  # ddiloco
        sync_every=8,
        overlap=1,
        outer_lr=1.0,
        outer_momentum=0.0,
    )
    address = sync.start()  # ddiloco
    launch = (
        [sys.executable]
        if args.ranks == 1
        else [
            shutil.which("torchrun") or str(Path(sys.executable).with_name("torchrun")),
            "--standalone",
            "--nproc-per-node",
            str(args.ranks),
        ]
    )
    data_args = [] if args.data is None else ["--data", args.data]
    learners = start_learners([*launch, __file__, *data_args, "--connect", address, "--learner"], 2)
    finished, codes = wait_for_run(sync, learners)  # sync.wait(timeout=...) while watching the learners
    sync.stop()  # ddiloco
    ddiloco.export_global(out / "ckpt", out / "export", hf_config=CONFIG)  # ddiloco
    model = LlamaForCausalLM.from_pretrained(str(out / "export"))
    exported = ddiloco.load_global(out / "ckpt")
    same = all(torch.equal(p.detach(), exported[n]) for n, p in model.named_parameters())
    after = eval_loss(model, data)
    print(
        f"run finished: {finished}; learners exited {codes}; eval loss {before:.3f} -> {after:.3f}; "
        f"from_pretrained equals the export: {same}; export: {out / 'export'}"
    )
    return 0 if finished and codes == [0, 0] and same and after < before - 0.5 else 1


if __name__ == "__main__":
    raise SystemExit(main())
