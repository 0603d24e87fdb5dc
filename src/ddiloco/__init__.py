"""Decoupled DiLoCo: independent learners, a fragment-wise synchronizer, no global barrier.

The names users import live here (`from ddiloco import LearnerClient`); they load on first use so
that `import ddiloco` stays cheap. The parts of the system, top down (docs/architecture.md):
cli -> api, launch, sim, goodput -> synchronizer, learner -> wire -> core; records, train and chaos serve
any of them.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

from .version import __version__

_PUBLIC = {
    "LearnerClient": "ddiloco.learner.client",
    "SynchronizerError": "ddiloco.learner.link",
    "SynchronizerServer": "ddiloco.synchronizer.server",
    "build_service": "ddiloco.synchronizer.server",
    "ServiceSettings": "ddiloco.synchronizer.settings",
    "Timeouts": "ddiloco.wire.timeouts",
    "AlgorithmConfig": "ddiloco.core.config",
    "make_task": "ddiloco.train.tasks",
    "InnerConfig": "ddiloco.train.inner",
    "make_inner_optimizer": "ddiloco.train.inner",
    "lr_at": "ddiloco.train.inner",
    "read_corpus": "ddiloco.train.text",
    "EventLog": "ddiloco.records.events",
    "read_events": "ddiloco.records.events",
    "Synchronizer": "ddiloco.api.synchronizer",
    "ResumableSampler": "ddiloco.api.data",
    "ResumableIterable": "ddiloco.api.data",
    "export_global": "ddiloco.api.export",
    "load_global": "ddiloco.api.export",
    "fetch_global": "ddiloco.api.export",
    "stop_run": "ddiloco.api.control",
    "end_ranks": "ddiloco.api.ranks",
    "save_initial": "ddiloco.api.model",
    "embedding_names": "ddiloco.api.model",
    "load_optimizer": "ddiloco.learner.state",
    "BackgroundSaver": "ddiloco.learner.state",
    "log_to_stderr": "ddiloco.records.logsetup",
}

__all__ = [
    "AlgorithmConfig",
    "BackgroundSaver",
    "EventLog",
    "InnerConfig",
    "LearnerClient",
    "load_optimizer",
    "ResumableIterable",
    "ResumableSampler",
    "ServiceSettings",
    "Synchronizer",
    "SynchronizerError",
    "SynchronizerServer",
    "Timeouts",
    "__version__",
    "build_service",
    "embedding_names",
    "end_ranks",
    "export_global",
    "fetch_global",
    "load_global",
    "log_to_stderr",
    "lr_at",
    "make_inner_optimizer",
    "make_task",
    "read_corpus",
    "read_events",
    "save_initial",
    "stop_run",
]

if TYPE_CHECKING:
    from .api.control import stop_run
    from .api.data import ResumableIterable, ResumableSampler
    from .api.export import export_global, fetch_global, load_global
    from .api.model import embedding_names, save_initial
    from .api.ranks import end_ranks
    from .api.synchronizer import Synchronizer
    from .core.config import AlgorithmConfig
    from .learner.client import LearnerClient
    from .learner.link import SynchronizerError
    from .learner.state import BackgroundSaver, load_optimizer
    from .records.events import EventLog, read_events
    from .records.logsetup import log_to_stderr
    from .synchronizer.server import SynchronizerServer, build_service
    from .synchronizer.settings import ServiceSettings
    from .train.inner import InnerConfig, lr_at, make_inner_optimizer
    from .train.tasks import make_task
    from .train.text import read_corpus
    from .wire.timeouts import Timeouts


def __getattr__(name: str) -> object:
    module = _PUBLIC.get(name)
    if module is None:
        raise AttributeError(f"module 'ddiloco' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_PUBLIC))
