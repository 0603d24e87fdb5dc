"""The pieces of the data-parallel baseline without processes: the lineage's accounting, the
checkpoint's format and atomic commit, the rendezvous rules, the settings' checks."""

from __future__ import annotations

import json
import math
import time
from pathlib import Path

import pytest
import torch

from ddiloco.dataparallel import checkpoint
from ddiloco.dataparallel.config import DataParallelConfig
from ddiloco.dataparallel.rendezvous import Coordinator, Membership
from ddiloco.dataparallel.replicated import Lineage, ensure_optimizer_state
from ddiloco.train.inner import InnerConfig, make_inner_optimizer


def test_lineage_counts_each_commit_and_round_trips():
    lineage = Lineage(3, window_start=100.0)
    lineage.commit([0, 2], tokens=200, seconds=1.5, started=100.0, now=101.0)
    lineage.commit([2], tokens=100, seconds=0.5, started=104.0, now=104.5)
    assert (lineage.step, lineage.tokens_merged, lineage.positions) == (2, 300, [1, 0, 2])
    assert lineage.useful_seconds == pytest.approx(2.0)
    assert lineage.covered_seconds == pytest.approx(1.5)  # [100, 101] and [104, 104.5]
    assert lineage.longest_gap == pytest.approx(3.5)  # 101 -> 104.5
    again = Lineage.from_json(3, json.loads(json.dumps(lineage.to_json())))
    assert again == lineage
    back = Lineage(3)
    back.load_tensor(lineage.to_tensor(torch.device("cpu")))
    assert back == lineage
    with pytest.raises(ValueError, match="for 3 workers"):
        Lineage.from_json(2, lineage.to_json())


def _model_and_optimizer(seed: int) -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.BatchNorm1d(3))
    return model, make_inner_optimizer(model, InnerConfig())


def test_checkpoint_restores_model_optimizer_and_lineage_without_pickle(tmp_path: Path):
    model, optimizer = _model_and_optimizer(0)
    model(torch.randn(5, 4)).sum().backward()
    optimizer.step()
    lineage = Lineage(2, step=7, tokens_merged=1400, positions=[4, 3])
    checkpoint.write(tmp_path, checkpoint.snapshot(model, optimizer, lineage))
    lineage.step = 9
    checkpoint.write(tmp_path, checkpoint.snapshot(model, optimizer, lineage, final=True))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["checkpoint.json", "step-00000009"]  # the older one gone
    suffixes = {p.suffix for p in tmp_path.rglob("*") if p.is_file()}
    assert suffixes <= {".json", ".safetensors"}
    other, other_opt = _model_and_optimizer(1)
    restored = checkpoint.restore(tmp_path, other, other_opt, workers=2)
    assert restored is not None and restored.step == 9 and restored.positions == [4, 3]
    for a, b in zip(model.state_dict().values(), other.state_dict().values(), strict=True):
        assert torch.equal(a, b)  # buffers (running stats) too
    for p, q in zip(model.parameters(), other.parameters(), strict=True):
        assert torch.equal(optimizer.state[p]["exp_avg_sq"], other_opt.state[q]["exp_avg_sq"])
    assert checkpoint.read_manifest(tmp_path)["final"] is True


def test_a_torn_checkpoint_is_not_seen(tmp_path: Path):
    model, optimizer = _model_and_optimizer(0)
    assert checkpoint.restore(tmp_path, model, optimizer, workers=2) is None
    (tmp_path / "step-00000003").mkdir()  # written, then killed before the manifest named it
    (tmp_path / "step-00000003" / checkpoint.MODEL).write_bytes(b"torn")
    assert checkpoint.restore(tmp_path, model, optimizer, workers=2) is None
    (tmp_path / checkpoint.MANIFEST).write_text("{not json")
    assert checkpoint.read_manifest(tmp_path) is None


def test_empty_optimizer_gets_state_shaped_like_a_trained_one():
    model, optimizer = _model_and_optimizer(0)
    ensure_optimizer_state(optimizer)
    trained, trained_opt = _model_and_optimizer(0)
    trained(torch.randn(5, 4)).sum().backward()
    trained_opt.step()
    for p, q in zip(model.parameters(), trained.parameters(), strict=True):
        mine, theirs = optimizer.state[p], trained_opt.state[q]
        assert sorted(mine) == sorted(theirs)
        assert all(mine[k].shape == theirs[k].shape and mine[k].dtype == theirs[k].dtype for k in mine)
    model(torch.randn(5, 4)).sum().backward()
    optimizer.step()  # AdamW takes the prepared state as its own
    assert all(math.isfinite(float(p.detach().sum())) for p in model.parameters())


def test_generations_name_their_members_and_a_worker_skips_those_without_it():
    coordinator = Coordinator(timeout=5)
    worker = Membership(coordinator.port, slot=1, timeout=5)
    assert worker.newest() == 0
    # the store's other client sees a key once the server has it: soon, not at once (CI saw a key
    # read back empty right after its write), so what the worker writes is polled for, bounded
    worker.hello(4242)
    assert eventually(lambda: coordinator.hello_pid(1) == 4242) and coordinator.hello_pid(0) is None
    coordinator.open([0])  # opened without worker 1
    coordinator.open([0, 1])
    assert worker.wait(after=0, timeout=5) == (2, [0, 1])
    with pytest.raises(TimeoutError):
        worker.wait(after=2, timeout=0.2)
    worker.report_failure(2)
    assert eventually(lambda: coordinator.failed_in(1) == 2) and coordinator.failed_in(0) == 0
    worker.mark_formed(2, {"world": 2})
    assert eventually(lambda: coordinator.formed(2) == {"world": 2}) and coordinator.formed(3) is None
    worker.stop()
    assert eventually(coordinator.stopped) and worker.wait(after=2, timeout=5) == (0, [])


def eventually(check, seconds: float = 5.0) -> bool:  # noqa: ANN001
    """True once `check()` is, polled for at most `seconds`."""
    deadline = time.monotonic() + seconds
    while not check() and time.monotonic() < deadline:
        time.sleep(0.01)
    return bool(check())


@pytest.mark.parametrize(
    "changes",
    [
        {"method": "fsdp"},
        {"tokens": None, "duration": None},
        {"tokens": 0},
        {"min_workers": 3},
        {"checkpoint_every": 0},
        {"collective_timeout": 0.0},
        {"allreduce_precision": "fp16"},
    ],
)
def test_bad_settings_are_refused_by_name(tmp_path: Path, changes: dict):
    with pytest.raises(ValueError):
        DataParallelConfig(**{"run_dir": tmp_path, "workers": 2, "tokens": 1000, **changes})


def test_worker_command_carries_the_learners_model_and_optimizer_flags(tmp_path: Path):
    config = DataParallelConfig(
        tmp_path, workers=2, tokens=1000, model_size="tiny", inner=InnerConfig(lr=1e-3, batch_size=4)
    )
    cmd = config.worker_command(1, 5555, 12.5)
    flags = dict(zip(cmd[4::2], cmd[5::2], strict=False))
    assert cmd[2:4] == ["ddiloco.dataparallel", "worker"]
    assert flags["--slot"] == "1" and flags["--store-port"] == "5555" and flags["--model-size"] == "tiny"
    assert float(flags["--inner-lr"]) == 1e-3 and flags["--batch-size"] == "4" and flags["--tokens"] == "1000"
    assert flags["--allreduce-precision"] == "bf16"  # the default: what users run
    fp32 = DataParallelConfig(tmp_path, workers=2, tokens=1000, allreduce_precision="fp32").worker_command(0, 1, 0.0)
    assert fp32[fp32.index("--allreduce-precision") + 1] == "fp32"
    assert config.as_dict()["quorum"] == 2 and config.worker_dir(1).name == "learner-1"
