"""A Lightning learner for the integration tests: a tiny byte-level language model on local text,
`Trainer(callbacks=[DecoupledDiLoCo(...)])`; writes what it trained and counted to OUT/rank-<rank>.json."""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

import lightning
import torch

SEQ, BATCH = 16, 8


class TinyLM(lightning.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.embed = torch.nn.Embedding(256, 16)
        self.mix = torch.nn.Linear(16, 16)
        self.head = torch.nn.Linear(16, 256)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.head(torch.relu(self.mix(self.embed(ids))))

    def training_step(self, batch: torch.Tensor, batch_idx: int) -> torch.Tensor:
        logits = self(batch[:, :-1])
        return torch.nn.functional.cross_entropy(logits.flatten(0, 1), batch[:, 1:].flatten())

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.AdamW(self.parameters(), lr=1e-2)


def windows(path: str, part: int, parts: int) -> torch.Tensor:
    data = Path(path).read_bytes()[:200_000]
    return torch.tensor([list(data[s : s + SEQ]) for s in range(part * SEQ, len(data) - SEQ, SEQ * parts)])


class Together(lightning.Callback):
    """Learners start their first step together and keep a pace. On two busy cores one learner's
    imports and Trainer set-up can outlast the other's whole budget of tiny steps: the barrier comes
    after DecoupledDiLoCo's own start (it registered and took the model), and each step is padded to
    `step_seconds`, so that a learner the scheduler leaves out for a moment still gets steps in."""

    def __init__(self, ready: str | None, learner: int, peers: int, step_seconds: float) -> None:
        self.ready, self.learner, self.peers, self.step_seconds = ready, learner, peers, step_seconds
        self.waited, self.started = False, 0.0

    def on_train_batch_start(self, trainer, module, batch, batch_idx) -> None:  # noqa: ANN001
        if self.ready and not self.waited:
            self.waited = True
            Path(self.ready, f"ready-{self.learner}").touch()
            deadline = time.monotonic() + 60
            while len(list(Path(self.ready).glob("ready-*"))) < self.peers and time.monotonic() < deadline:
                time.sleep(0.05)
        self.started = time.monotonic()

    def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx) -> None:  # noqa: ANN001
        time.sleep(max(0.0, self.started + self.step_seconds - time.monotonic()))


def main() -> int:
    from ddiloco.integrations.lightning import DecoupledDiLoCo

    parser = argparse.ArgumentParser()
    parser.add_argument("--connect", required=True)
    parser.add_argument("--id", type=int, default=0)
    parser.add_argument("--data", required=True)
    parser.add_argument("--out", required=True)
    parser.add_argument("--max-steps", type=int, default=500)
    parser.add_argument("--ready", default=None, help="a folder: start training once --peers learners wrote to it")
    parser.add_argument("--peers", type=int, default=1)
    parser.add_argument("--step-seconds", type=float, default=0.0, help="pad each step to at least this long")
    args = parser.parse_args()
    torch.set_num_threads(1)
    torch.manual_seed(0)
    module = TinyLM()
    callback = DecoupledDiLoCo(args.connect, args.id, report_every=1e9)
    trainer = lightning.Trainer(
        accelerator="cpu",
        devices=1,
        max_steps=args.max_steps,
        callbacks=[callback, Together(args.ready, args.id, args.peers, args.step_seconds)],
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    loader = torch.utils.data.DataLoader(windows(args.data, args.id, 2), batch_size=BATCH, shuffle=True)
    trainer.fit(module, loader)
    stats = callback.stats()
    result = {
        "rank": int(os.environ.get("RANK", "0")),
        "global_step": trainer.global_step,
        "client": {k: stats.get(k) for k in ("steps", "tokens", "accepted", "pushed")},
    }
    Path(args.out, f"rank-{result['rank']}.json").write_text(json.dumps(result))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
