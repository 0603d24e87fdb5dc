"""Where a learner computes and in what precision: CUDA when present, the CPU otherwise; bf16 through
autocast, so the parameters, the inner optimizer's state and everything sent stay fp32."""

from __future__ import annotations

import contextlib
import os

import torch

PRECISIONS = ("fp32", "bf16")


def resolve_device(spec: str = "auto", local_rank: int | None = None) -> torch.device:
    """ "auto": cuda:LOCAL_RANK when CUDA is present, else the CPU. An explicit CUDA device that is not
    there is an error, not a silent fall-back."""
    rank = int(os.environ.get("LOCAL_RANK", "0")) if local_rank is None else local_rank
    if spec == "auto":
        return (
            torch.device("cuda", rank % torch.cuda.device_count()) if torch.cuda.is_available() else torch.device("cpu")
        )
    try:
        device = torch.device(spec)
    except RuntimeError as exc:
        raise ValueError(f"unknown device {spec!r}: use auto, cpu, cuda or cuda:N") from exc
    if device.type == "cuda":
        if not torch.cuda.is_available():
            raise ValueError(f"--device {spec}: this machine has no CUDA device (torch {torch.__version__})")
        index = rank % torch.cuda.device_count() if device.index is None else device.index
        if index >= torch.cuda.device_count():
            raise ValueError(f"--device {spec}: only {torch.cuda.device_count()} CUDA devices")
        device = torch.device("cuda", index)
    elif device.type != "cpu":
        raise ValueError(f"--device {spec}: a learner runs on cpu or cuda")
    return device


def process_group_backend(device: torch.device) -> str:
    """NCCL between the ranks of a learner on GPUs, gloo on the CPU."""
    return "nccl" if device.type == "cuda" else "gloo"


def autocast(precision: str, device: torch.device) -> contextlib.AbstractContextManager:
    """The forward pass's precision: fp32 as is, bf16 under torch.autocast (master weights stay fp32)."""
    if precision not in PRECISIONS:
        raise ValueError(f"precision must be one of {PRECISIONS}, got {precision!r}")
    if precision == "fp32":
        return contextlib.nullcontext()
    return torch.autocast(device.type, dtype=torch.bfloat16)


STEP_SLOWDOWN_ENV = "DDILOCO_STEP_SLOWDOWN"


def step_slowdown(learner: int) -> float:
    """How much slower than the others learner (or worker) `learner`'s emulated accelerator is:
    `DDILOCO_STEP_SLOWDOWN=1,1,2,1.3` stretches its `--min-step-seconds` pad by its factor (1 when
    unset or not listed). A benchmark knob for mixed hardware in real processes (benchmarks/time_to_loss.py),
    read from the environment so every method's processes get it alike."""
    text = os.environ.get(STEP_SLOWDOWN_ENV, "").strip()
    if not text:
        return 1.0
    try:
        factors = [float(x) for x in text.split(",")]
    except ValueError:
        raise ValueError(f"{STEP_SLOWDOWN_ENV} must be comma-separated numbers, got {text!r}") from None
    if any(not (1.0 <= f < float("inf")) for f in factors):
        raise ValueError(f"{STEP_SLOWDOWN_ENV}: every factor is a slowdown >= 1, got {text!r}")
    return factors[learner] if 0 <= learner < len(factors) else 1.0
