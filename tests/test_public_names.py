"""The names users import from the top, and the 0.2 paths that 0.3 removed (CHANGELOG.md)."""

from __future__ import annotations

import importlib

import pytest

import ddiloco


def test_public_names_at_the_top():
    from ddiloco.core.config import AlgorithmConfig
    from ddiloco.learner.client import LearnerClient
    from ddiloco.synchronizer.server import SynchronizerServer, build_service

    assert ddiloco.LearnerClient is LearnerClient and ddiloco.AlgorithmConfig is AlgorithmConfig
    assert ddiloco.SynchronizerServer is SynchronizerServer and ddiloco.build_service is build_service
    from ddiloco.train.inner import InnerConfig, lr_at, make_inner_optimizer

    assert ddiloco.InnerConfig is InnerConfig and ddiloco.make_inner_optimizer is make_inner_optimizer
    assert ddiloco.lr_at is lr_at  # the inner optimizer and schedule `ddiloco learner` builds, for one's own loop
    for name in ddiloco.__all__:
        assert getattr(ddiloco, name) is not None, name
    with pytest.raises(AttributeError):
        ddiloco.no_such_name  # noqa: B018


@pytest.mark.parametrize(
    "old",
    ["ddiloco.net", "ddiloco.net.client", "ddiloco.net.launch.procs", "ddiloco.sim.goodput", "ddiloco.accounting"],
)
def test_the_paths_deprecated_in_0_2_are_gone_in_0_3(old):
    with pytest.raises(ModuleNotFoundError):
        importlib.import_module(old)
