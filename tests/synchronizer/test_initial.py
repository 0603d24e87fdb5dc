"""An --init file read one tensor at a time (`synchronizer.initial`): shapes from the header alone, and a
shard that reads only its own fragments' values, each once."""

from __future__ import annotations

import pytest
import torch
from safetensors.torch import save_file

from ddiloco.core import AlgorithmConfig
from ddiloco.synchronizer.checkpoint import CheckpointError
from ddiloco.synchronizer.initial import TensorFile
from ddiloco.synchronizer.server import build_service
from ddiloco.synchronizer.settings import ServiceSettings
from ddiloco.wire.protocol import signature

PARAMS = {f"l{i}.{k}": torch.randn(3 + i, 4) if k == "w" else torch.randn(4) for i in range(4) for k in ("w", "b")}


class Counted(TensorFile):
    """A TensorFile that records which tensors were read."""

    def __init__(self, *args: object) -> None:
        super().__init__(*args)  # type: ignore[arg-type]
        self.read: list[str] = []

    def __getitem__(self, name: str) -> torch.Tensor:
        self.read.append(name)
        return super().__getitem__(name)


def test_shapes_come_from_the_header_and_values_when_looked_up(tmp_path):
    save_file(dict(PARAMS, half=torch.ones(2, dtype=torch.bfloat16)), str(tmp_path / "init.safetensors"))
    f = TensorFile(tmp_path / "init.safetensors")
    assert set(f) == set(PARAMS) | {"half"} and len(f) == len(PARAMS) + 1
    assert all(f.shapes[n].is_meta and f.shapes[n].shape == t.shape for n, t in PARAMS.items())
    assert f.shapes["half"].dtype == torch.bfloat16
    assert all(torch.equal(f[n], t) for n, t in PARAMS.items())
    a, b = f["l0.w"], f["l0.w"]
    a.add_(1)  # each lookup is a tensor of its own, not a view of the file
    assert torch.equal(b, PARAMS["l0.w"])
    with pytest.raises(KeyError):
        f["missing"]


def test_a_bad_file_is_refused_at_open_and_a_non_finite_tensor_when_read(tmp_path):
    with pytest.raises(CheckpointError, match="is missing"):
        TensorFile(tmp_path / "none.safetensors")
    (tmp_path / "junk.safetensors").write_bytes(b"\x08\x00\x00\x00\x00\x00\x00\x00notjson!")
    with pytest.raises(CheckpointError, match="not a readable safetensors"):
        TensorFile(tmp_path / "junk.safetensors")
    save_file({"ok": torch.ones(2), "bad": torch.tensor([1.0, float("nan")])}, str(tmp_path / "nan.safetensors"))
    f = TensorFile(tmp_path / "nan.safetensors")  # the header is fine
    assert torch.equal(f["ok"], torch.ones(2))
    with pytest.raises(CheckpointError, match="'bad' holds NaN"):
        f["bad"]


def test_a_shard_reads_only_its_own_fragments_once_and_holds_their_exact_values(tmp_path):
    save_file(PARAMS, str(tmp_path / "init.safetensors"))
    config = AlgorithmConfig(fragments=4, sync_every=4)  # the file holds the names sorted, as eager loading gave them
    eager = build_service(dict(sorted(PARAMS.items())), config, ServiceSettings(shard=1, num_shards=2))
    f = Counted(tmp_path / "init.safetensors")
    lazy = build_service(f.shapes, config, ServiceSettings(shard=1, num_shards=2), values=f)
    owned = [n for p in lazy.core.owned for n in lazy.core.plan.names[p]]
    assert lazy.core.owned == [1, 3] and sorted(f.read) == sorted(owned) and len(owned) < len(PARAMS)
    assert lazy.core.plan == eager.core.plan and lazy.identity == eager.identity
    assert lazy.identity["signature"] == signature(PARAMS)
    held = lazy.core.state.params
    assert set(held) == set(owned) and all(torch.equal(held[n], PARAMS[n]) for n in owned)
