"""`ddiloco learner`'s training loop (`learner.trainer.train`) with the inner-optimizer options, against an
in-process synchronizer: the learning rate warms up again after every step whose boundary brought a
global value in (`LearnerClient.step` names the fragments it wrote), and Muon's state is saved to and
loaded from the learner's own state folder."""

from __future__ import annotations

import pytest

from ddiloco.core import AlgorithmConfig
from ddiloco.learner import trainer
from ddiloco.learner.trainer import LearnerSettings
from ddiloco.train.inner import InnerConfig
from ddiloco.train.inner import lr_at as real_lr_at
from ddiloco.train.optimizers import MuonWithAdamW

from ..support.runtime import synchronizer

# blocking syncs of one fragment, one learner: the merged model comes back at every 4th boundary
BLOCKING = AlgorithmConfig(fragments=1, sync_every=4, overlap=0, quorum=1, grace=0.0)
FLAT = InnerConfig(lr=1e-3, warmup_steps=0, min_lr_ratio=1.0, batch_size=4)


def settings(address: str, shakespeare: str, inner: InnerConfig, **more: object) -> LearnerSettings:
    return LearnerSettings(
        learner=0,
        addresses=address,
        model="gpt",
        model_size="tiny",
        data=shakespeare,
        seq_len=16,
        inner=inner,
        start_timeout=30.0,
        peer_recovery=False,
        **more,
    )


@pytest.fixture
def task(shakespeare):  # noqa: ANN001, ANN201
    from ddiloco.train.tasks import make_task

    return make_task("gpt", shakespeare, seq_len=16, model_size="tiny")


def test_the_learner_s_learning_rate_warms_up_again_after_each_adoption(task, shakespeare, monkeypatch):
    seen: list[tuple[int | None, float]] = []

    def recording(config, step, progress, since_adoption=None):  # noqa: ANN001, ANN202
        lr = real_lr_at(config, step, progress, since_adoption)
        seen.append((since_adoption, lr))
        return lr

    monkeypatch.setattr(trainer, "lr_at", recording)
    inner = InnerConfig(**{**FLAT.to_dict(), "rewarm_steps": 2})
    with synchronizer(task, algorithm=BLOCKING, tokens=10**9) as (_, address):
        stats = trainer.train(settings(address, shakespeare, inner, max_steps=12))
    assert stats["steps"] == 12
    # joined before step 1; a merged model in at every 4th boundary: 0, 1, 2, 3 steps since, three times
    assert [since for since, _ in seen] == [0, 1, 2, 3] * 3
    assert [lr for _, lr in seen] == pytest.approx([5e-4, 1e-3, 1e-3, 1e-3] * 3)


def test_a_muon_learner_saves_its_inner_state_and_a_restart_loads_it(task, shakespeare, tmp_path, monkeypatch):
    loaded: list[int | None] = []
    load = trainer.load_optimizer

    def recording(directory, optimizer):  # noqa: ANN001, ANN202
        assert isinstance(optimizer, MuonWithAdamW)
        loaded.append(load(directory, optimizer))
        return loaded[-1]

    monkeypatch.setattr(trainer, "load_optimizer", recording)
    inner = InnerConfig(**{**FLAT.to_dict(), "optimizer": "muon"})
    with synchronizer(task, algorithm=BLOCKING, tokens=10**9) as (_, address):
        for _ in range(2):
            learner = settings(address, shakespeare, inner, max_steps=4, state_dir=str(tmp_path), checkpoint_every=4)
            assert trainer.train(learner)["steps"] == 4
    assert loaded == [None, 4]  # nothing at the first start; the 4 steps' Muon and AdamW state at the second
