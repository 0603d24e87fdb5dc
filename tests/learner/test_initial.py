"""A fresh learner that built the run's initial model itself does not download it: the synchronizer
answers its registration's digests with "you hold it" for every fragment that matches, bit for bit."""

import pytest
import torch

from ddiloco.core import AlgorithmConfig
from ddiloco.learner.client import LearnerClient
from ddiloco.learner.initial import InitialValues, kept
from ddiloco.synchronizer.server import SynchronizerServer, build_service
from ddiloco.synchronizer.settings import ServiceSettings
from ddiloco.wire.framing import WireError

from ..support.runtime import FAST, mlp_run, train_until_accepted


def model_bytes(model: torch.nn.Module) -> int:
    return sum(2 * p.numel() for p in model.parameters())  # bf16, the default download


@pytest.mark.parametrize("codec_down", ["bf16", "int8"])
def test_a_learner_built_like_the_synchronizer_joins_without_downloading_and_trains_on(codec_down):
    # overwrite: the final flush has nothing left to send (a flushed fragment's merge comes down as a
    # notice without values), so the learner ends on the version the synchronizer's shadow holds
    with mlp_run(width=256, codec_down=codec_down, arrival="overwrite") as (service, client, model):
        joined = client.links[0].stats.bytes_received
        assert joined < 1000 < model_bytes(model), f"{joined} bytes received at the join"
        assert all(torch.equal(client.params[n].detach(), service.core.params[n]) for n in client.params)
        assert client.ctx.initial is None  # no later update may say "you hold it"
        if codec_down == "bf16":
            assert not service.dispatcher._encoded  # nobody needed the value: it was not even encoded
        assert train_until_accepted(client, model, 6) >= 6
        client.finish(timeout=30)
        for p in range(2):  # merged updates came down and apply (a difference needs the held shadow)
            assert client.core.versions[p] >= 1
        assert client.links[0].stats.bytes_received > joined + model_bytes(model) // 8
        # pushes stream their frames as they are made: the learner still counts every byte the synchronizer got
        assert client.links[0].stats.bytes_pushed == service.traffic.bytes_received > 0
        if codec_down == "int8":
            down = service.dispatcher.downlink
            for p in range(2):
                version, shadow = down._shadow[p]
                # an update encoded as the learner stopped stepping moves the shadow on; the learner
                # never applies it (it takes no more steps), so it may hold the version before
                assert version - 1 <= client.core.versions[p] <= version
                if client.core.versions[p] == version:
                    assert all(torch.equal(client.params[n].detach(), shadow[n].float()) for n in shadow)


def test_a_fragment_that_differs_in_one_bit_is_downloaded_and_only_that_one():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 256), torch.nn.ReLU(), torch.nn.Linear(256, 1))
    params = {n: p.detach().clone() for n, p in model.named_parameters()}
    service = build_service(
        params, AlgorithmConfig(fragments=2, sync_every=4, overlap=1), ServiceSettings(timeouts=FAST, tokens=10**9)
    )
    changed = service.core.plan.names[0][0]
    with torch.no_grad():
        w = dict(model.named_parameters())[changed]
        w.view(-1)[0] = torch.nextafter(w.view(-1)[0], torch.tensor(10.0))
    server = SynchronizerServer(service)
    address = server.start()
    try:
        with LearnerClient(model, address, learner_id=0, timeouts=FAST, report_every=1e9) as client:
            got = client.links[0].stats.bytes_received
            assert sum(2 * params[n].numel() for n in service.core.plan.names[0]) < got < model_bytes(model)
            for n in service.core.plan.names[0]:  # the synchronizer's value, as sent (bf16)
                assert torch.equal(client.params[n].detach(), params[n].to(torch.bfloat16).float())
            for n in service.core.plan.names[1]:  # its own, which is the synchronizer's
                assert torch.equal(client.params[n].detach(), params[n])
    finally:
        server.stop(grace=0.2)


def test_values_that_changed_since_registering_are_not_kept():
    params = {"w": torch.ones(4), "b": torch.zeros(2)}
    initial = InitialValues(params)
    values = kept(initial, ["w"])
    assert torch.equal(values["w"], params["w"]) and values["w"].data_ptr() != params["w"].data_ptr()
    params["w"][1] = 2.0
    with pytest.raises(WireError, match="changed"):
        kept(initial, ["w"])
    with pytest.raises(WireError, match="never offered"):
        kept(initial, ["nope"])
    with pytest.raises(WireError, match="did not offer"):
        kept(None, ["b"])
