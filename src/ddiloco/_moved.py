"""Old import paths of modules that moved in 0.2 keep working for one release, with a warning.

`ddiloco.net.client` became `ddiloco.learner.client`, and so on (the table below). Importing an old
path yields a stand-in module that holds the new module's names (the same objects, so `isinstance`
and identity checks hold) and warns once with DeprecationWarning naming the new path. Remove this
module, and the finder that `ddiloco/__init__.py` installs, in 0.3.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import sys
import types
import warnings

REMOVED_IN = "0.3"

# old module path -> new module path. Old packages map to a package so that their submodules resolve.
MOVED: dict[str, str] = {
    "ddiloco.accounting": "ddiloco.records.intervals",
    "ddiloco.net": "",  # a package of nothing but old paths
    "ddiloco.net.atomic": "ddiloco.records.atomic",
    "ddiloco.net.eventlog": "ddiloco.records.events",
    "ddiloco.net.logsetup": "ddiloco.records.logsetup",
    "ddiloco.net.wire": "ddiloco.wire.framing",
    "ddiloco.net.quant": "ddiloco.wire.quant",
    "ddiloco.net.protocol": "ddiloco.wire.protocol",
    "ddiloco.net.rpc": "ddiloco.wire.rpc",
    "ddiloco.net.auth": "ddiloco.wire.auth",
    "ddiloco.net.timeouts": "ddiloco.wire.timeouts",
    "ddiloco.net.routing": "ddiloco.wire.routing",
    "ddiloco.net.service": "ddiloco.synchronizer.service",
    "ddiloco.net.handlers": "ddiloco.synchronizer.handlers",
    "ddiloco.net.server": "ddiloco.synchronizer.server",
    "ddiloco.net.commit": "ddiloco.synchronizer.commit",
    "ddiloco.net.checkpoint": "ddiloco.synchronizer.checkpoint",
    "ddiloco.net.ledger": "ddiloco.synchronizer.ledger",
    "ddiloco.net.report": "ddiloco.synchronizer.status",
    "ddiloco.net.outbox": "ddiloco.synchronizer.outbox",
    "ddiloco.net.client": "ddiloco.learner.client",
    "ddiloco.net.link": "ddiloco.learner.link",
    "ddiloco.net.fanout": "ddiloco.learner.fanout",
    "ddiloco.net.journal": "ddiloco.learner.journal",
    "ddiloco.net.learner_state": "ddiloco.learner.state",
    "ddiloco.net.trainer": "ddiloco.learner.trainer",
    "ddiloco.net.launch": "ddiloco.launch",
    "ddiloco.net.launch.chaos": "ddiloco.chaos.injector",
    "ddiloco.net.launch.config": "ddiloco.launch.config",
    "ddiloco.net.launch.evaluate": "ddiloco.launch.evaluate",
    "ddiloco.net.launch.live": "ddiloco.launch.live",
    "ddiloco.net.launch.procs": "ddiloco.launch.procs",
    "ddiloco.net.launch.summary": "ddiloco.launch.summary",
    "ddiloco.net.launch.supervisor": "ddiloco.launch.supervisor",
    "ddiloco.sim.goodput": "ddiloco.goodput",
    **{f"ddiloco.sim.goodput.{name}": f"ddiloco.goodput.{name}" for name in (
        "config", "ddp", "decoupled", "diloco", "elastic", "failures", "partition", "plot", "progress",
        "result", "runner", "stats", "timeline", "trace_export")},
}


def _caller_stacklevel() -> int:
    """The stack level of the first frame outside the import machinery and this module."""
    frame, level = sys._getframe(1), 1
    while frame is not None and (frame.f_code.co_filename.startswith("<frozen importlib")
                                 or frame.f_code.co_filename == __file__):
        frame, level = frame.f_back, level + 1
    return level


class _MovedLoader(importlib.abc.Loader):
    def __init__(self, new: str) -> None:
        self.new = new

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> types.ModuleType:
        return types.ModuleType(spec.name)

    def exec_module(self, module: types.ModuleType) -> None:
        module.__doc__ = f"Deprecated alias of {self.new or 'nothing'}."
        if not self.new:
            return
        target = importlib.import_module(self.new)
        warnings.warn(f"{module.__name__} moved to {self.new}; the old path goes away in {REMOVED_IN}",
                      DeprecationWarning, stacklevel=_caller_stacklevel())
        if hasattr(module, "__path__"):
            # A package: its submodules resolve through MOVED, so copy only what it re-exports.
            names = {k: v for k, v in vars(target).items()
                     if not k.startswith("__") and not isinstance(v, types.ModuleType)}
            module.__dict__.update(names)
            return
        module.__dict__.update({k: v for k, v in vars(target).items() if not k.startswith("__")})
        module.__getattr__ = lambda name: getattr(target, name)  # names added to the target later


class MovedFinder(importlib.abc.MetaPathFinder):
    """Resolves the old paths in `MOVED`; it sits last on sys.meta_path, so it never shadows a module."""

    def find_spec(self, fullname, path=None, target=None):  # noqa: ANN001, ANN201 (importlib's signature)
        new = MOVED.get(fullname)
        if new is None:
            return None
        is_package = any(old.startswith(fullname + ".") for old in MOVED)
        return importlib.machinery.ModuleSpec(fullname, _MovedLoader(new), is_package=is_package)


def install() -> None:
    if not any(isinstance(f, MovedFinder) for f in sys.meta_path):
        sys.meta_path.append(MovedFinder())
