"""Updates down as quantised differences: both sides hold the same bits, error feedback keeps the
learners' value on the master copy, and a learner that lacks the base version gets the whole value."""

import pytest
import torch

from ddiloco.learner.held import HeldValues
from ddiloco.synchronizer.downlink import DeltaDownlink
from ddiloco.synchronizer.outbox import Outbox
from ddiloco.synchronizer.settings import ServiceSettings
from ddiloco.wire import framing, reassembly

from ..support.runtime import mlp_run, train_until_accepted


def received(frames: list[bytes]) -> reassembly.Message:
    r = reassembly.Reassembler(1 << 30)
    out = [m for m in (r.feed(f) for f in frames) if m is not None]
    assert len(out) == 1
    return out[0]


@pytest.mark.parametrize("codec, bound", [("int8", 0.02), ("int4", 0.2)])
def test_the_learner_holds_the_synchronizers_bits_and_feedback_keeps_them_on_the_master(codec, bound):
    torch.manual_seed(0)
    down, learner = DeltaDownlink(codec, 1 << 16), HeldValues()
    learner.reset(True)
    theta = {"w": torch.randn(3000, 7), "b": torch.randn(5)}
    step = 1e-2
    sizes = []
    for version in range(60):
        if version:
            for t in theta.values():
                t.add_(step * torch.randn_like(t) + step)  # a drift, so that a lost residual would accumulate
        enc = down.encode({"kind": "update", "fragment": 0, "version": version}, 0, version, theta)
        frames = enc.full() if enc.delta is None else enc.delta
        assert (enc.delta is None) == (version == 0)
        msg = received(frames)
        got = learner.take(0, version, msg.head.get("delta_from"), msg.tensors())
        shadow = down._shadow[0][1]
        assert all(torch.equal(got[n], shadow[n].float()) for n in theta), "learner and synchronizer disagree"
        if enc.delta is not None:
            sizes.append((sum(map(len, enc.delta)), sum(map(len, enc.full()))))
        for n in theta:  # never further from the master than one quantisation step of one update and bf16
            err = (got[n] - theta[n]).abs().max().item()
            assert err <= bound * step * 10 + 2**-7 * theta[n].abs().max().item(), (version, n, err)
    ratio = sum(d for d, _ in sizes) / sum(f for _, f in sizes)
    assert ratio < (0.6 if codec == "int8" else 0.35), f"{codec} differences are {ratio:.2f} of bf16"


def test_a_difference_from_a_version_the_learner_lacks_is_refused():
    learner = HeldValues()
    learner.reset(True)
    learner.take(0, 3, None, {"w": torch.zeros(4)})
    with pytest.raises(framing.WireError, match="holds 3"):
        learner.take(0, 5, 4, {"w": torch.zeros(4)})
    learner.reset(False)  # a synchronizer that sends whole values: a difference is a protocol error
    with pytest.raises(framing.WireError):
        learner.take(0, 4, 3, {"w": torch.zeros(4)})


def drain(box: Outbox) -> list[bytes]:
    out = []
    while (f := box.get(0.01)) is not None:
        out.append(f)
    return out


def test_the_outbox_sends_a_difference_only_after_the_version_it_needs():
    down = DeltaDownlink("int4", 1 << 20)
    theta = {"w": torch.ones(4096)}
    encoded = []
    for v in range(6):
        theta["w"] += 0.5 * torch.rand(4096)
        encoded.append(down.encode({"kind": "update", "fragment": 0, "version": v}, 0, v, theta))
    counted: list[tuple[int, bool, int]] = []  # what Traffic hears: each update's bytes, form, whole payload
    box = Outbox(lambda n, as_difference, whole: counted.append((n, as_difference, whole)))
    box.put_update(0, 0, encoded[0])
    assert drain(box) == encoded[0].full()
    box.put_update(0, 1, encoded[1])
    assert drain(box) == encoded[1].delta  # holds 0: the difference
    box.put_update(0, 2, encoded[2])
    box.put_update(0, 3, encoded[3])  # queued back to back (one group commit): a chain, smaller than the whole
    assert drain(box) == encoded[2].delta + encoded[3].delta
    box.put_update(0, 5, encoded[5])  # this learner never got 4: the whole value
    assert drain(box) == encoded[5].full()
    size = [sum(map(len, frames)) for frames in (encoded[0].full(), encoded[1].delta, encoded[5].full())]
    chain = [sum(map(len, encoded[v].delta)) for v in (2, 3)]  # two updates in one stream: counted apart
    whole = 2 * 4096  # bf16 values of the one tensor, before their headers
    assert counted == [
        (size[0], False, whole),
        (size[1], True, whole),
        (chain[0], True, whole),
        (chain[1], True, whole),
        (size[2], False, whole),
    ]
    assert size[1] < size[0] / 2  # an int4 difference against a whole bf16 value
    fresh = Outbox()  # a new session: nothing streamed yet, the whole value first
    fresh.put_update(0, 1, encoded[1])
    fresh.put_update(0, 2, encoded[2])  # a chain must start from what the learner holds: none here
    assert drain(fresh) == encoded[2].full()


def test_a_chain_as_large_as_the_whole_value_gives_way_to_it():
    down = DeltaDownlink("int8", 1 << 20)  # two int8 differences weigh about one bf16 value
    encoded = [
        down.encode({"kind": "update", "fragment": 0, "version": v}, 0, v, {"w": torch.full((4096,), v + 1.0)})
        for v in range(3)
    ]
    box = Outbox()
    box.put_update(0, 0, encoded[0])
    drain(box)
    box.put_update(0, 1, encoded[1])
    box.put_update(0, 2, encoded[2])
    assert drain(box) == encoded[2].full()


def test_a_learner_trains_on_differences_from_a_real_synchronizer_and_holds_its_shadow():
    with mlp_run(width=32, codec_down="int8", arrival="overwrite") as (service, client, model):
        down = service.dispatcher.downlink
        encoded: dict[tuple[int, int], dict[str, torch.Tensor]] = {}
        encode = down.encode

        def recording(head, fragment, version, tensors):  # the shadow of every version sent
            out = encode(head, fragment, version, tensors)
            encoded[(fragment, version)] = {n: t.clone() for n, t in down._shadow[fragment][1].items()}
            return out

        down.encode = recording
        assert train_until_accepted(client, model, 8) >= 8
        # finish() leaves once its work is merged. Steps taken after the last value arrived go up as
        # final work, whose merge comes down as a notice without the value: the learner then ends one
        # version behind the shadow, so it is compared with the shadow of the version it holds
        client.finish(timeout=30)
        for p in range(2):  # what the learner's base copy holds is the synchronizer's shadow, bit for bit
            version, latest = client.core.versions[p], down._shadow[p][0]
            assert 2 <= version <= latest
            shadow = encoded[(p, version)]
            assert all(torch.equal(client.core.base[p][n], shadow[n].float()) for n in shadow)
            if version == latest:  # no final work: overwrite arrival put the value in the model too
                assert all(torch.equal(client.params[n].detach(), shadow[n].float()) for n in shadow)


def test_an_unknown_download_codec_is_refused_up_front():
    with pytest.raises(ValueError, match="codec_down"):
        ServiceSettings(codec_down="int3")
    with pytest.raises(ValueError, match="difference codec"):
        DeltaDownlink("bf16", 1 << 20)
