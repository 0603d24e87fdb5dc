"""A learner process for the resume test: a tiny model trained on an index dataset through
`ResumableSampler` and a DataLoader worker; every step's sample indices are appended (and flushed)
to OUT as one JSON line {"incarnation", "position", "indices"}, so that a test can compare what a
killed process and its replacement trained. Usage: python sampler_learner.py ADDRESS LEARNER OUT"""

from __future__ import annotations

import json
import sys

import torch
from torch.utils.data import DataLoader, Dataset

import ddiloco
from ddiloco.wire.timeouts import Timeouts

N, BATCH = 4096, 8


class Indexed(Dataset):
    def __len__(self) -> int:
        return N

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        return torch.tensor(i), torch.full((4,), float(i % 7))


def model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Embedding(8, 4), torch.nn.Linear(4, 4))


def main(address: str, learner: int, out: str) -> None:
    torch.set_num_threads(1)
    net = model()
    optimizer = torch.optim.SGD(net.parameters(), lr=0.01)
    sampler = ddiloco.ResumableSampler(Indexed(), learner, 2, batch_size=BATCH, seed=3)
    loader = DataLoader(
        Indexed(), batch_size=BATCH, sampler=sampler, num_workers=1, multiprocessing_context="forkserver"
    )
    client = ddiloco.LearnerClient(net, address, learner, timeouts=Timeouts.derive(0.1))
    sampler.seek(client.start())
    with open(out, "a", buffering=1) as log:
        for index, target in loader:
            loss = ((net[1](net[0](index % 8)) - target) ** 2).mean()
            loss.backward()
            optimizer.step()
            optimizer.zero_grad()
            # logged before client.step hands the step's work to the pusher: a kill -9 between its merge
            # and a line written after it left counted work that the log did not show (under load)
            position = client.position + 1  # the position this step takes the learner to
            log.write(
                json.dumps({"incarnation": client.incarnation, "position": position, "indices": index.tolist()}) + "\n"
            )
            client.step(tokens=BATCH)
            if client.stopping:
                break
    client.finish(timeout=10)


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]), sys.argv[3])
