"""Message buffers used again once nothing refers to them any more.

A fragment-sized message buffer that is new each time costs a page fault per 4 KiB as its bytes
arrive: at 16M parameters that was half a pull's time on the learner and a fifth of a push's on the
synchronizer, more than the copy itself. A pool hands the same buffers out again. A buffer goes back
only when its last view is gone (the tensors decoded from it, the memoryviews of its payload), which
a `weakref.finalize` on the array every view refers to tells, so a message can never be
overwritten while something still reads it. What the pool keeps is capped in bytes (oldest dropped
first), so odd sizes from a bad peer cannot make it grow.
"""

from __future__ import annotations

import threading
import weakref
from collections import deque
from typing import TYPE_CHECKING, cast

import torch

if TYPE_CHECKING:
    from typing_extensions import Buffer

MIN_POOLED_BYTES = 1 << 20  # smaller messages come and go through the allocator's own free lists


def new_buffer(nbytes: int) -> memoryview:
    """A writable, uninitialised buffer: address space until written (`torch.empty` maps pages
    lazily); RuntimeError or MemoryError if the system cannot even reserve it."""
    # cast: numpy's stubs type ndarray's buffer protocol (__buffer__) for Python >= 3.12 only
    return memoryview(cast("Buffer", torch.empty(nbytes, dtype=torch.uint8).numpy())).cast("B")


class BufferPool:
    def __init__(self, max_bytes: int, min_bytes: int = MIN_POOLED_BYTES) -> None:
        """`max_bytes`: the most the pool keeps while its buffers are unused."""
        self.max_bytes = max(0, int(max_bytes))
        self.min_bytes = min_bytes
        self._free: dict[int, list[torch.Tensor]] = {}
        self._order: deque[int] = deque()  # sizes in the order their buffers came back, for eviction
        self._free_bytes = 0
        self._lock = threading.Lock()
        self.allocated = 0  # buffers made (a pool that serves keeps this at the number in use at once)
        self.reused = 0

    @property
    def free_bytes(self) -> int:
        return self._free_bytes

    def take(self, nbytes: int) -> memoryview:
        """A buffer of exactly `nbytes`, as `new_buffer` makes them."""
        if nbytes < self.min_bytes or nbytes > self.max_bytes:
            return new_buffer(nbytes)
        base = None
        with self._lock:
            free = self._free.get(nbytes)
            if free:
                base = free.pop()
                self._free_bytes -= nbytes
                self._order.remove(nbytes)
                self.reused += 1
        if base is None:
            base = torch.empty(nbytes, dtype=torch.uint8)
            self.allocated += 1
        array = base.numpy()  # a new array per loan: every view of this loan refers to it
        weakref.finalize(array, self._give_back, base).atexit = False
        # cast: numpy's stubs type ndarray's buffer protocol (__buffer__) for Python >= 3.12 only
        return memoryview(cast("Buffer", array)).cast("B")

    def _give_back(self, base: torch.Tensor) -> None:
        n = base.numel()
        with self._lock:
            self._free.setdefault(n, []).append(base)
            self._order.append(n)
            self._free_bytes += n
            while self._free_bytes > self.max_bytes and self._order:
                oldest = self._order.popleft()
                self._free[oldest].pop(0)
                self._free_bytes -= oldest
                if not self._free[oldest]:
                    del self._free[oldest]
