"""Memory that the synchronizer frees goes back to the system.

glibc serves allocations above its mmap threshold with mmap and returns them on free, but it raises
that threshold to the size of every large block freed (up to 32 MB). After the first round every
fragment-sized tensor then comes from the heap, and freed heap memory is kept and fragmented: the
synchronizer's RSS grew to 4x what it holds (`benchmarks/synchronizer_scale.py`). A fixed threshold
keeps large tensors on mmap, at the price of page faults when they are allocated again; it sits
above the wire's 1 MiB frames, which come and go by the thousand and are best served by the heap.
glibc also gives each thread that allocates its own arena (up to 8 per core), and each keeps the
frames its thread freed: with gRPC's thread pool that was most of what stayed above the need at
10M parameters (1.9x -> 1.6x; 1.4-1.6x -> 1.3-1.4x at 50M). One arena serves them all; the merges,
which allocate nothing per round, do not slow down.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import logging

log = logging.getLogger(__name__)
M_MMAP_THRESHOLD = -3  # glibc's mallopt parameters
M_ARENA_MAX = -8
THRESHOLD_BYTES = 2 << 20
ARENAS = 1


def return_freed_memory(threshold: int = THRESHOLD_BYTES, arenas: int = ARENAS) -> bool:
    """Fix glibc's mmap threshold and arena count for this process; False without glibc."""
    name = ctypes.util.find_library("c")
    if name is None:
        return False
    try:
        libc = ctypes.CDLL(name)
        ok = bool(libc.mallopt(M_MMAP_THRESHOLD, ctypes.c_int(threshold)))
        ok = bool(libc.mallopt(M_ARENA_MAX, ctypes.c_int(arenas))) and ok
    except (OSError, AttributeError):  # not glibc (musl, macOS): its allocator keeps its own policy
        return False
    if not ok:
        log.debug("mallopt refused the mmap threshold or the arena count")
    return ok
