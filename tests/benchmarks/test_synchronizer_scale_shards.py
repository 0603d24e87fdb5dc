"""benchmarks/synchronizer_scale_shards.py's pieces: the init file it writes one tensor at a time is a
safetensors file the synchronizer reads, and what a shard must hold, by hand."""

from __future__ import annotations

import sys
from pathlib import Path

import torch
from safetensors.torch import load_file

from ddiloco.core import plan_for_model
from ddiloco.synchronizer.initial import TensorFile
from ddiloco.wire.routing import owned_fragments

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))

import synchronizer_scale  # noqa: E402
import synchronizer_scale_shards as shards  # noqa: E402


def test_the_streamed_init_file_is_the_model_the_single_synchronizer_benchmark_builds(tmp_path):
    layout = shards.write_init(tmp_path / "init.safetensors", 40 * 16 * 1024)
    loaded = load_file(str(tmp_path / "init.safetensors"))
    model = synchronizer_scale.model(40 * 16 * 1024)
    assert list(layout) == sorted(model) and {n: tuple(t.shape) for n, t in loaded.items()} == {
        n: tuple(t.shape) for n, t in model.items()
    }
    assert all(loaded[n].dtype == torch.float32 for n in loaded)
    assert all(torch.all(loaded[n] == 0) for n in loaded if n.endswith("bias"))
    weights = torch.cat([loaded[n].flatten() for n in loaded if n.endswith("weight")])
    assert 0.015 < float(weights.std()) < 0.025  # N(0, 0.02)
    f = TensorFile(tmp_path / "init.safetensors")  # as a shard reads it: the same plan from the header alone
    assert plan_for_model(f.shapes, 8) == plan_for_model(loaded, 8)


def test_what_a_shard_must_hold_is_params_and_momentum_in_fp32_and_a_round_of_its_largest_fragment():
    # 4 shards of 1B parameters, P = 16: each owns 4 fragments of 62.5M; 4 learners push bf16
    owned, largest = 250_000_000, 62_500_000
    need = shards.need_bytes(owned, largest, 4)
    assert need == 250_000_000 * 4 * 2 + 62_500_000 * 2 * 4 + 62_500_000 * 4  # 2 GB + 500 MB + 250 MB
    assert shards.need_bytes(owned, largest, 8) - need == 62_500_000 * 2 * 4  # each learner more: a bf16 fragment
    assert owned_fragments(1, 4, 16) == [1, 5, 9, 13]  # the benchmark's shards own what a sharded run's do
