"""Learners' shards: how the training text is dealt to the learners, and what it does to the gap.

Two measurements, one per question:

* **How alike are the shards?** For each layout (`contiguous`: shard s is the s-th quarter of the
  text, as before 0.4; `interleaved`: blocks of 4096 tokens dealt round-robin, the default), a
  bigram model counted on each shard alone is scored on the validation split (the text's last
  tenth): its cross-entropy in nats per token. Shards that are alike score alike; a shard that
  scores best holds the text most like the validation split, which the model loses whenever that
  shard's learner is down or slow.
* **Does the layout make the gap to data-parallel?** At one of gap.py's sizes (20 tokens per
  parameter, no failures, virtual clock), data-parallel with 4 workers and synchronous and
  Decoupled DiLoCo with M = 4 train at gap.py's tuned settings (Muon, gap.json's cells) with each
  layout, every seed; the gap is each method's mean final eval loss over data-parallel's, in percent.
  The settings were tuned with contiguous shards: a gap that closes with the layout would be the
  layout's, one that does not is not.

Every run is kept in `--out` as it ends and a rerun resumes from it.

    python benchmarks/shards.py --quick --json         # 12k parameters, one seed: a minute
    python benchmarks/shards.py --out benchmarks/results/shards.json --json   # 84k, 3 seeds: ~15 min
    python benchmarks/shards.py --data FILE ...        # another text (default: the stdlib's source)
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from gap import FULL, QUICK, sim_config  # noqa: E402
from scaling import gpt  # noqa: E402

from ddiloco.sim.run import run_sim  # noqa: E402
from ddiloco.train.corpus import encoded_corpus  # noqa: E402
from ddiloco.train.streams import SHARD_LAYOUTS, TokenWindowStream  # noqa: E402
from ddiloco.train.tasks import LanguageModelTask  # noqa: E402

LEARNERS = 4
#: gap.json's tuned settings with Muon at 84k (its cells "muon"); data-parallel's inner lr bracketed there
TUNED = {
    "ddp": {"inner_lr": 0.024},
    "diloco-m4": {"inner_lr": 0.012, "outer_lr": 0.7, "outer_momentum": 0.5},
    "decoupled-m4": {"inner_lr": 0.012, "outer_lr": 0.35, "outer_momentum": 0.7},
}
MUON = {"optimizer": "muon"}


def shard_tokens(train: np.ndarray, layout: str, shard: int, seq_len: int) -> np.ndarray:
    """Every token a learner of `shard` can read (the union of its stream's blocks)."""
    stream = TokenWindowStream(train, seq_len, shard, LEARNERS, 1, 0, layout)
    return np.concatenate([train[lo:hi] for lo, hi in stream.blocks()])


def bigram_nats(train: np.ndarray, val: np.ndarray, vocab: int, alpha: float = 0.1) -> float:
    """Cross-entropy on `val` of a bigram model counted on `train` (add-alpha smoothing)."""
    counts = np.full((vocab, vocab), alpha)
    np.add.at(counts, (train[:-1], train[1:]), 1.0)
    probs = counts / counts.sum(axis=1, keepdims=True)
    return float(-np.log(probs[val[:-1], val[1:]]).mean())


def likeness(data: str | None, seq_len: int) -> dict[str, list[float]]:
    corpus = encoded_corpus(data and Path(data), "byte", 1024, 0.1)
    train, val = np.asarray(corpus.train), np.asarray(corpus.val)
    vocab = int(max(train.max(), val.max())) + 1
    return {
        layout: [bigram_nats(shard_tokens(train, layout, s, seq_len), val, vocab) for s in range(LEARNERS)]
        for layout in SHARD_LAYOUTS
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true", help="12k parameters at 4 tokens per parameter, one seed")
    p.add_argument("--json", action="store_true", help="end with one JSON line: bigram and gap")
    p.add_argument("--out", type=Path, default=None, help="runs file (resumed from if it exists)")
    p.add_argument("--data", default=None, help="training text (default: the Python standard library's source)")
    p.add_argument("--size", default=None, help="one of gap.py's sizes (default 84k; --quick 12k)")
    p.add_argument("--seeds", type=int, default=None, help="seeds per configuration (default 3; --quick 1)")
    p.add_argument("--no-gap", action="store_true", help="the shards' likeness alone (no training)")
    args = p.parse_args(argv)
    torch.set_num_threads(1)
    cfg = dict(QUICK if args.quick else FULL)
    size = args.size or cfg["sizes"][0]
    seeds = args.seeds or (1 if args.quick else 3)
    context = {k: cfg[k] for k in ("ratio", "seq_len", "sync_every", "global_batch", "eval_batches")}
    context |= {"data": args.data, "size": size, "tuned": TUNED}
    saved = json.loads(args.out.read_text()) if args.out and args.out.is_file() else {}
    runs: list[dict] = saved.get("runs", []) if saved.get("context") == context else []
    corpus = encoded_corpus(args.data and Path(args.data), "byte", 1024, 0.1)
    for layout in SHARD_LAYOUTS if not args.no_gap else ():
        task = LanguageModelTask("gpt", gpt(size, cfg["seq_len"]), corpus, layout)
        for method, settings in TUNED.items():
            for seed in range(seeds):
                if any(r["layout"] == layout and r["method"] == method and r["seed"] == seed for r in runs):
                    continue
                at = {**settings, "seed": float(seed)}
                result = run_sim(sim_config({**cfg, "shard_layout": layout}, size, method, at, MUON), task=task)
                runs.append({"layout": layout, "method": method, "seed": seed, "eval_loss": result["eval_loss"]})
                print(f"{layout} {size} {method} seed {seed}: {result['eval_loss']:.4f}", file=sys.stderr, flush=True)
                if args.out is not None:
                    args.out.parent.mkdir(parents=True, exist_ok=True)
                    tmp = args.out.with_suffix(".tmp")
                    tmp.write_text(json.dumps({"context": context, "runs": runs}, indent=1) + "\n")
                    tmp.replace(args.out)
    gap: dict[str, dict] = {}
    for layout in SHARD_LAYOUTS if not args.no_gap else ():
        loss = {
            m: [r["eval_loss"] for r in runs if r["layout"] == layout and r["method"] == m and r["seed"] < seeds]
            for m in TUNED
        }
        ddp = statistics.mean(loss["ddp"])
        per_seed = {  # paired by seed, as gap.py pairs them
            m: [100 * (a / b - 1) for a, b in zip(v, loss["ddp"], strict=True)] for m, v in loss.items() if m != "ddp"
        }
        gap[layout] = {
            "loss": {m: statistics.mean(v) for m, v in loss.items()},
            "gap_pct": {m: 100 * (statistics.mean(v) / ddp - 1) for m, v in loss.items() if m != "ddp"},
            "gap_per_seed": per_seed,
            "gap_se": {m: statistics.stdev(g) / len(g) ** 0.5 if len(g) > 1 else None for m, g in per_seed.items()},
        }
    bigram = likeness(args.data, cfg["seq_len"])
    for layout in SHARD_LAYOUTS:
        nats = ", ".join(f"{x:.3f}" for x in bigram[layout])
        gaps = ", ".join(f"{m} {g:+.2f} %" for m, g in gap[layout]["gap_pct"].items()) if gap else "not run"
        print(f"{layout:>11}: shards' bigram nats on the validation text {nats}; gap to data-parallel {gaps}")
    report = {"size": size, "seeds": seeds, "bigram": bigram, "gap": gap}
    if args.out is not None:  # the runs and what they come to, for docs and tools/claims.py
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps({"context": context, "runs": runs, "report": report}, indent=1) + "\n")
    if args.json:
        print(json.dumps(report, sort_keys=True))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
