"""The client in a plain PyTorch loop with a model the synchronizer only knows from a safetensors file."""

import pytest
import torch
from safetensors.torch import load_file, save_file

from ddiloco.core import AlgorithmConfig
from ddiloco.learner.client import LearnerClient
from ddiloco.synchronizer.server import SynchronizerServer, build_service
from ddiloco.synchronizer.settings import ServiceSettings

from ..support.runtime import FAST

pytestmark = pytest.mark.timeout(60)


def mlp():
    return torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1))


def test_a_user_model_trains_through_the_client_in_a_few_lines(tmp_path, caplog):
    torch.manual_seed(0)
    model = mlp()
    save_file({n: p.detach().contiguous() for n, p in model.named_parameters()}, str(tmp_path / "init.safetensors"))
    params = load_file(str(tmp_path / "init.safetensors"))  # what `ddiloco synchronizer --init` loads
    service = build_service(
        params, AlgorithmConfig(fragments=2, sync_every=4, overlap=1), ServiceSettings(timeouts=FAST, tokens=200 * 32)
    )
    server = SynchronizerServer(service)
    address = server.start()
    try:
        torch.manual_seed(1)
        learner = mlp()  # initialised differently: start() overwrites it with the global parameters
        optimizer = torch.optim.AdamW(learner.parameters(), lr=1e-2)
        target = torch.randn(8, 1)
        caplog.set_level("INFO", logger="ddiloco")
        with LearnerClient(learner, address, learner_id=0, timeouts=FAST, report_every=0.0) as client:
            # the global parameters, as they travel down by default (bf16)
            assert all(torch.equal(p, params[n].bfloat16().float()) for n, p in learner.named_parameters())
            while not client.stopping:
                x = torch.randn(32, 8)
                loss = (learner(x) - x @ target).pow(2).mean()
                loss.backward()
                optimizer.step()
                optimizer.zero_grad()
                client.step(tokens=32)
            stats = client.stats()
        assert stats["accepted"] > 0 and stats["tokens"] >= 200 * 32
        progress = [r.getMessage() for r in caplog.records if r.getMessage().startswith("learner 0: step ")]
        assert len(progress) >= 200 and "contributions accepted" in progress[-1]  # one per step at report_every 0
        assert service.status()["merges"] > 0
        moved = any(not torch.equal(service.core.params[n], params[n]) for n in params)
        assert moved, "the global model never moved"
    finally:
        server.stop(grace=0.2)
