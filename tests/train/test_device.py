"""Where and in what precision a learner computes: CUDA when present, else the CPU; bf16 by autocast."""

import pytest
import torch

from ddiloco.train.device import autocast, process_group_backend, resolve_device

no_cuda = pytest.mark.skipif(torch.cuda.is_available(), reason="checks the behaviour of a machine without CUDA")


@no_cuda
def test_auto_is_the_cpu_without_cuda_and_a_missing_cuda_is_an_error():
    assert resolve_device("auto") == torch.device("cpu")
    assert process_group_backend(resolve_device("auto")) == "gloo"
    for spec in ("cuda", "cuda:1"):
        with pytest.raises(ValueError, match="no CUDA device"):
            resolve_device(spec)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_auto_takes_the_local_ranks_gpu():
    assert resolve_device("auto", local_rank=0) == torch.device("cuda", 0)
    assert process_group_backend(resolve_device("auto", local_rank=0)) == "nccl"


def test_unknown_devices_are_errors():
    for spec in ("tpu", "meta", "gpu0"):
        with pytest.raises(ValueError):
            resolve_device(spec)
    assert resolve_device("cpu") == torch.device("cpu")


def test_bf16_runs_the_forward_in_bf16_and_keeps_fp32_weights():
    layer = torch.nn.Linear(8, 4)
    x = torch.randn(2, 8)
    with autocast("bf16", torch.device("cpu")):
        y = layer(x)
    assert y.dtype == torch.bfloat16 and layer.weight.dtype == torch.float32
    with autocast("fp32", torch.device("cpu")):
        assert layer(x).dtype == torch.float32
    with pytest.raises(ValueError, match="precision"):
        autocast("fp16", torch.device("cpu"))
