"""Torch work on the calling thread alone, for a thread that works while a transfer runs beside it.

A push's norms are taken chunk by chunk as its frames arrive (`core.StreamedNorms`), on the thread
that receives them. PyTorch would split each chunk's conversion and sum over its OpenMP threads, and
while the learner sends, every other core is busy (on loopback the sender's core also moves the
bytes): each split op then waits for a thread that is not running. On this 2-core machine the norms
of 50M bf16 values took 10-14 ms on one thread, 22 ms on two with the other core busy, and 0.8-1.5 s
on two beside a niced background job. OpenMP's thread count is a per-thread setting, so limiting it
here (`threadpoolctl`) leaves every other thread's as it was.
"""

from __future__ import annotations

import threading
from contextlib import AbstractContextManager

import torch
from threadpoolctl import ThreadpoolController

_lock = threading.Lock()
_openmp: ThreadpoolController | None = None


def one_thread() -> AbstractContextManager[object]:
    """A context in which torch ops of this thread run on it alone (none where torch has no OpenMP)."""
    global _openmp
    with _lock:
        if _openmp is None:
            _openmp = ThreadpoolController().select(user_api="openmp")
    torch.get_num_threads()  # torch sets a thread's OpenMP count at its first use: done now, not inside
    return _openmp.limit(limits=1)
