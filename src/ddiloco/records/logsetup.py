"""Process-wide logging for the runtime's commands: one line per record on stderr, tagged with the
process's role, so that the launcher's per-process log files read well side by side."""

from __future__ import annotations

import logging
import os
import sys
from typing import NoReturn


def configure(role: str, level: str = "info") -> None:
    """Log records to stderr; SIGUSR1 dumps every thread's stack there (for a process that seems stuck)."""
    import faulthandler
    import signal

    faulthandler.register(signal.SIGUSR1, all_threads=True)
    numeric = getattr(logging, level.upper(), None)
    if not isinstance(numeric, int):
        raise ValueError(f"unknown log level {level!r}; use debug, info, warning or error")
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter(f"%(asctime)s {role} %(levelname)s %(name)s: %(message)s"))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(numeric)


def log_to_stderr(level: str | int = "info") -> logging.Handler:
    """Show ddiloco's own log records (joins, progress, rejections) on stderr, for a script that uses
    the library without configuring logging. Touches only the "ddiloco" logger, never the root;
    calling it again changes the level and adds no second handler."""
    numeric = getattr(logging, level.upper(), None) if isinstance(level, str) else level
    if not isinstance(numeric, int):
        raise ValueError(f"unknown log level {level!r}; use debug, info, warning or error")
    logger = logging.getLogger("ddiloco")
    handler = next((h for h in logger.handlers if getattr(h, "_ddiloco", False)), None)
    if handler is None:
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s", "%H:%M:%S"))
        handler._ddiloco = True  # type: ignore[attr-defined]
        logger.addHandler(handler)
    logger.setLevel(numeric)
    return handler


def exit_now(code: int) -> NoReturn:
    """End the process with `code` without Python's finalization, once what it wrote is flushed (its
    output and log records). For a process that held a gloo group, whose teardown at finalization can
    abort it (SIGABRT), and for one whose wait is over (a stuck teardown, a stop signal's grace)."""
    sys.stdout.flush()
    sys.stderr.flush()
    logging.shutdown()
    os._exit(code)
