"""A learner for the layer-wise fragments test: a small model with a `layers` ModuleList (as torchtitan's
and HF's decoder models have), trained on local text through `LearnerClient` in its own process. It
writes OUT (JSON): the fragments it was given at registration (their parameter names) and, per step,
the fragments whose global value `client.step` wrote into the model.

Usage: python layer_learner.py ADDRESS DATA STEPS OUT"""

from __future__ import annotations

import json
import sys

import numpy as np
import torch

SEQ, BATCH, LAYERS = 16, 8, 4


class Block(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.norm = torch.nn.LayerNorm(32)
        self.mlp = torch.nn.Linear(32, 32)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + torch.nn.functional.gelu(self.mlp(self.norm(x)))


class LayerNet(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.tok_embeddings = torch.nn.Embedding(256, 32)
        self.layers = torch.nn.ModuleList([Block() for _ in range(LAYERS)])
        self.norm = torch.nn.LayerNorm(32)
        self.output = torch.nn.Linear(32, 256)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        x = self.tok_embeddings(ids)
        for layer in self.layers:
            x = layer(x)
        return self.output(self.norm(x))


def build() -> LayerNet:
    torch.manual_seed(0)
    return LayerNet()


def main(address: str, data: str, steps: int, out: str) -> None:
    import ddiloco

    torch.set_num_threads(1)
    net = build()
    optimizer = torch.optim.AdamW(net.parameters(), lr=3e-3)
    text = np.frombuffer(open(data, "rb").read(), dtype=np.uint8)
    client = ddiloco.LearnerClient(net, address, 0, codec="fp32", report_every=1e9)
    client.start()
    applied: list[list[int]] = []
    for step in range(steps):
        starts = np.random.default_rng(step).integers(0, len(text) - SEQ - 1, BATCH)
        window = torch.from_numpy(np.stack([text[s : s + SEQ + 1] for s in starts]).astype(np.int64))
        loss = torch.nn.functional.cross_entropy(net(window[:, :-1]).reshape(-1, 256), window[:, 1:].reshape(-1))
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        applied.append(client.step(tokens=BATCH * SEQ, loss=loss.item()))
    names = [client.fragment_names(p) for p in range(len(client.names))]
    stats = client.finish()
    result = {"names": names, "applied": applied, "accepted": stats["accepted"], "steps": stats["steps"]}
    with open(out, "w") as f:
        json.dump(result, f)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4])
