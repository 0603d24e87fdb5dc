"""Process-wide logging for the runtime's commands: one line per record on stderr, tagged with the
process's role, so that the launcher's per-process log files read well side by side."""

from __future__ import annotations

import logging
import sys


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
