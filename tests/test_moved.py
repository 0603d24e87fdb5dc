"""Old import paths (before 0.2) still work for one release, warn, and give the very same objects."""

from __future__ import annotations

import importlib
import sys
import warnings

import pytest

import ddiloco
from ddiloco._moved import MOVED


def fresh_import(name: str):
    for key in [k for k in sys.modules if k == name or k.startswith(name + ".")]:
        del sys.modules[key]
    return importlib.import_module(name)


@pytest.mark.parametrize("old", sorted(k for k, v in MOVED.items() if v))
def test_every_old_path_imports_with_a_warning(old):
    with pytest.warns(DeprecationWarning, match=MOVED[old].replace(".", r"\.")):
        module = fresh_import(old)
    new = importlib.import_module(MOVED[old])
    shared = [k for k in vars(new) if not k.startswith("_") and not isinstance(getattr(new, k), type(sys))]
    assert shared or hasattr(module, "__path__"), f"{MOVED[old]} exports nothing"
    for key in shared:
        assert getattr(module, key) is getattr(new, key), key


def test_old_names_are_the_same_objects():
    from ddiloco.learner.client import LearnerClient
    from ddiloco.wire import framing

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        fresh_import("ddiloco.net")
        from ddiloco.net import wire
        from ddiloco.net.client import LearnerClient as Old
        from ddiloco.net.launch.procs import ProcessTable
        from ddiloco.sim.goodput import GoodputConfig

    assert Old is LearnerClient and wire.message is framing.message
    assert ProcessTable is importlib.import_module("ddiloco.launch.procs").ProcessTable
    assert GoodputConfig is importlib.import_module("ddiloco.goodput").GoodputConfig


def test_an_unknown_old_path_still_fails():
    with pytest.raises(ModuleNotFoundError):
        importlib.import_module("ddiloco.net.no_such_module")


def test_public_names_at_the_top():
    from ddiloco.core.config import AlgorithmConfig
    from ddiloco.learner.client import LearnerClient
    from ddiloco.synchronizer.server import SynchronizerServer, build_service

    assert ddiloco.LearnerClient is LearnerClient and ddiloco.AlgorithmConfig is AlgorithmConfig
    assert ddiloco.SynchronizerServer is SynchronizerServer and ddiloco.build_service is build_service
    for name in ddiloco.__all__:
        assert getattr(ddiloco, name) is not None, name
    with pytest.raises(AttributeError):
        ddiloco.no_such_name  # noqa: B018
