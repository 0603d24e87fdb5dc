"""Fragment snapshots that leave the training thread at once: the parameters are copied into reused
host buffers (pinned, on a side stream, where the model is on CUDA) and the outer gradient
Theta - theta is computed later, in place, by the thread that encodes and sends it.

At a step boundary the training thread only issues copies. On the CPU that is one memcpy of the
fragment. On CUDA it is a device-to-device copy on the compute stream, so the optimizer may write
the parameters again at once, and a non-blocking copy to pinned host memory on a side stream, which
the sending thread waits for. Buffers are reused per fragment once the previous contribution's
bytes are encoded (`StagedGradient.release`); a snapshot whose previous buffer is still in use (a
retry while the old push is queued) takes a fresh one, so two contributions never share memory.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator, Mapping

import torch


class StagedGradient(Mapping[str, torch.Tensor]):
    """The outer gradients of one snapshot, computed on first access (waits for the copy)."""

    def __init__(
        self,
        stager: SnapshotStager,
        fragment: int,
        base: Mapping[str, torch.Tensor],
        buffers: dict[str, torch.Tensor],
        ready: torch.cuda.Event | None,
    ) -> None:
        self._stager = stager
        self._fragment = fragment
        self._base = dict(base)  # the references of the snapshot's time: an arrival replaces, never mutates, them
        self._buffers = buffers
        self._ready = ready
        self._lock = threading.Lock()
        self._done = False
        self._released = False

    def _compute(self) -> dict[str, torch.Tensor]:
        with self._lock:
            if self._released:
                raise RuntimeError("this snapshot's buffers were released")
            if not self._done:
                if self._ready is not None:
                    self._ready.synchronize()
                with torch.no_grad():
                    for name, buf in self._buffers.items():
                        torch.sub(self._base[name], buf, out=buf)  # v = Theta - theta, in the snapshot's buffer
                self._base = {}
                self._done = True
        return self._buffers

    def __getitem__(self, name: str) -> torch.Tensor:
        return self._compute()[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._buffers)

    def __len__(self) -> int:
        return len(self._buffers)

    def release(self) -> None:
        """The gradients were encoded: their buffers may serve the fragment's next snapshot."""
        with self._lock:
            if self._released:
                return
            self._released = True
        self._stager._give_back(self._fragment, self._buffers)


class SnapshotStager:
    """Per-fragment host buffers (fp32; pinned when the parameters are on CUDA) and the side stream."""

    def __init__(self, params: Mapping[str, torch.Tensor]) -> None:
        self.params = params
        devices = {t.device for t in params.values()}
        cuda = [d for d in devices if d.type == "cuda"]
        if len(cuda) > 1:
            raise ValueError(f"parameters on several CUDA devices {sorted(map(str, cuda))}: one learner, one device")
        self.device = cuda[0] if cuda else None
        self.pinned = self.device is not None
        self.stream = torch.cuda.Stream(self.device) if self.device is not None else None
        self._free: dict[int, list[dict[str, torch.Tensor]]] = {}
        self._lock = threading.Lock()
        self.allocated = 0  # buffer sets made so far (reuse keeps this at about one per fragment)

    def _take(self, fragment: int, names: list[str]) -> dict[str, torch.Tensor]:
        with self._lock:
            free = self._free.get(fragment)
            if free:
                return free.pop()
            self.allocated += 1
        return {n: torch.empty(self.params[n].shape, dtype=torch.float32, pin_memory=self.pinned) for n in names}

    def _give_back(self, fragment: int, buffers: dict[str, torch.Tensor]) -> None:
        with self._lock:
            self._free.setdefault(fragment, []).append(buffers)

    def stage(self, fragment: int, base: Mapping[str, torch.Tensor]) -> StagedGradient:
        """Copy the fragment's current values; `base` holds its global value Theta (fp32, on the host)."""
        names = list(base)
        buffers = self._take(fragment, names)
        ready = None
        with torch.no_grad():
            if self.stream is None:
                for n in names:
                    buffers[n].copy_(self.params[n].detach())
            else:
                compute = torch.cuda.current_stream(self.device)
                # A device copy first (fast, on the compute stream): the optimizer may overwrite the
                # parameters while the slower copy to the host runs on the side stream.
                copies = {n: self.params[n].detach().to(torch.float32, copy=True) for n in names}
                self.stream.wait_stream(compute)
                with torch.cuda.stream(self.stream):
                    for n in names:
                        buffers[n].copy_(copies[n], non_blocking=True)
                        copies[n].record_stream(self.stream)  # not reused before the side stream is done
                    ready = torch.cuda.Event()
                    ready.record(self.stream)
        return StagedGradient(self, fragment, base, buffers, ready)


def release(gradients: Mapping[str, torch.Tensor]) -> None:
    """Hand a contribution's buffers back once encoded (a no-op for plain dicts)."""
    if isinstance(gradients, StagedGradient):
        gradients.release()


def pin(tensors: dict[str, torch.Tensor], pinned: bool) -> dict[str, torch.Tensor]:
    """Arrived tensors in page-locked memory, so the copy into the model does not block the host."""
    return {n: t.pin_memory() for n, t in tensors.items()} if pinned else tensors
