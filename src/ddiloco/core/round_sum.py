"""A round's merge, summed as its contributions arrive.

Token-weighted RDA is a weighted sum of unit vectors and of norms, and the weighted mean a running
weighted mean of values: both can be added up one contribution at a time, in one pass each, after
which the contribution's tensors are dropped. A synchronizer then holds one running sum per open round instead
of every contribution until the round merges.

    RDA:  update = (sum w |v| / sum w) * unit(sum w unit(v))
    mean: update = sum w v / sum w

If every weight is zero (learners that report no tokens) the round falls back to equal weights, so
an equal-weight sum is kept until the first positive weight arrives.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Collection, Iterator, Mapping
from dataclasses import dataclass, field

import torch

from .outer import max_abs

CHUNK = 1 << 18  # values converted at a time: 1 MB of float32, in cache, one buffer per thread
_scratch = threading.local()


def float_chunks(x: torch.Tensor) -> Iterator[torch.Tensor]:
    """`x` flattened, as float32 chunks of CHUNK values: views of it when it is float32, else one
    reused buffer refilled per chunk (use each chunk before taking the next). A bf16 contribution is
    thus read in float32 without a float32 copy of it: converting it whole costs a fresh fragment
    of memory and its page faults, and torch's mixed-dtype kernels are several times slower."""
    flat = x.reshape(-1)
    if flat.dtype == torch.float32:
        yield from flat.split(CHUNK)  # type: ignore[no-untyped-call]  # torch defines Tensor.split without annotations
        return
    buf = getattr(_scratch, "buf", None)
    if buf is None:
        buf = _scratch.buf = torch.empty(CHUNK)
    for part in flat.split(CHUNK):  # type: ignore[no-untyped-call]  # torch defines Tensor.split without annotations
        chunk = buf[: part.numel()]
        chunk.copy_(part)
        yield chunk


class AccumulatorPool:
    """The float32 sums of finished rounds, handed to the next rounds: a fragment-sized allocation
    per round would fault in every page again (the synchronizer returns freed memory to the system,
    see `synchronizer/heap`). It keeps at most as many as were in use at once."""

    def __init__(self) -> None:
        self._free: dict[tuple[int, ...], list[torch.Tensor]] = {}

    def take(self, shape: torch.Size) -> torch.Tensor:
        free = self._free.get(tuple(shape))
        return free.pop() if free else torch.empty(shape)

    def give(self, t: torch.Tensor) -> None:
        self._free.setdefault(tuple(t.shape), []).append(t)


def chunked(x: torch.Tensor) -> bool:
    """Whether `norm` sums `x` chunk by chunk (`chunk_square`), so that its squares may be taken as
    the chunks come (`StreamedNorms`): a large tensor in a dtype other than float32."""
    return x.dtype != torch.float32 and x.numel() > CHUNK


def chunk_square(part: torch.Tensor) -> float:
    """The squared L2 norm of one chunk of at most CHUNK values (`float_chunks`' cut), in float32.
    A synchronizer takes these on its receiving thread for every pushed byte: the chunk goes
    into the thread's buffer directly (the generator and its split cost a tenth more there).
    `vector_norm` sums in a cascade; `torch.dot`, faster, drifts by 1e-5 over a chunk."""
    flat = part.reshape(-1)
    if flat.dtype != torch.float32:
        buf = getattr(_scratch, "buf", None)
        if buf is None:
            buf = _scratch.buf = torch.empty(CHUNK)
        flat = buf[: flat.numel()].copy_(flat)
    return float(torch.linalg.vector_norm(flat)) ** 2


def norm(x: torch.Tensor, squares: list[float] | None = None) -> float:
    """L2 norm: one float32 pass; non-finite exactly when `x` holds NaN or Inf (values whose
    squares overflow float32 are rescaled first, a slow path that sane updates never take).
    `squares`: the `chunk_square` of each chunk of `x` in order, when they were taken already
    (`StreamedNorms`); the result is the same to the bit."""
    if not chunked(x):
        n = float(torch.linalg.vector_norm(x, dtype=torch.float32))
    else:
        parts = x.reshape(-1).split(CHUNK)  # type: ignore[no-untyped-call]  # torch defines Tensor.split without annotations
        if squares is None or len(squares) != len(parts):
            squares = [chunk_square(part) for part in parts]
        n = math.sqrt(sum(squares))
    if math.isinf(n):
        top = max_abs(x)
        if math.isfinite(top) and top > 0:
            return top * float(torch.linalg.vector_norm(x / top, dtype=torch.float32))
    return n


class StreamedNorms:
    """Each tensor's `norm`, taken while its values still arrive: a receiver that fills one flat
    buffer front to back (a pushed contribution) tells `advance` how many bytes are in, and the
    squares of every chunk now complete are taken then, so that once the last byte is in only the
    last chunk is left to read (the norm pass otherwise starts only then, while the sender waits for
    its reply). `norms` gives what `norm` would, to the bit."""

    def __init__(self, tensors: Mapping[str, torch.Tensor], offsets: Mapping[str, int]) -> None:
        """`tensors`: views of the buffer being filled; `offsets`: where each starts in it, in bytes."""
        self._todo = sorted(
            ((offsets[n], n, t) for n, t in tensors.items() if chunked(t)), key=lambda item: item[0], reverse=True
        )
        self._tensors = dict(tensors)
        self._squares: dict[str, list[float]] = {n: [] for _, n, _ in self._todo}

    def advance(self, filled: int) -> None:
        """The buffer's first `filled` bytes are in: square every chunk they complete."""
        while self._todo:
            start, name, t = self._todo[-1]
            flat, done = t.reshape(-1), self._squares[name]
            size = t.element_size()
            while len(done) * CHUNK < flat.numel():
                end = min((len(done) + 1) * CHUNK, flat.numel())
                if start + end * size > filled:
                    return
                done.append(chunk_square(flat[len(done) * CHUNK : end]))
            self._todo.pop()

    def norms(self) -> dict[str, float]:
        """`norm` of every tensor, the buffer complete (what `advance` has not taken is taken now)."""
        return {n: norm(t, self._squares.get(n)) for n, t in self._tensors.items()}


@dataclass
class _Sums:
    """RDA tensors: sum (w / w_first) unit(v), scaled so that large weights cannot overflow float32;
    mean tensors: the running weighted mean itself (a convex combination: it cannot overflow either)."""

    tensors: dict[str, torch.Tensor] = field(default_factory=dict)
    norm_sums: dict[str, float] = field(default_factory=dict)  # sum w |v|, per tensor (RDA)
    weight: float = 0.0
    first: float = 0.0  # the first weight, the unit of the RDA sums

    def add(
        self,
        values: Mapping[str, torch.Tensor],
        norms: Mapping[str, float],
        w: float,
        rda: Collection[str],
        pool: AccumulatorPool | None,
    ) -> None:
        self.first = self.first or w
        total = self.weight + w
        for name, v in values.items():
            acc = self.tensors.get(name)
            fresh = acc is None
            if fresh:
                acc = self.tensors[name] = pool.take(v.shape) if pool is not None else torch.empty(v.shape)
            assert acc is not None  # made just above when it was missing
            if name in rda:
                n = norms[name]
                alpha = w / self.first / n if n > 0 else 0.0
                self.norm_sums[name] = self.norm_sums.get(name, 0.0) + (w * n if n > 0 else 0.0)
                for a, b in zip(acc.view(-1).split(CHUNK), float_chunks(v), strict=True):  # type: ignore[no-untyped-call]  # torch defines Tensor.split without annotations
                    torch.mul(b, alpha, out=a) if fresh else a.add_(b, alpha=alpha)
            else:
                for a, b in zip(acc.view(-1).split(CHUNK), float_chunks(v), strict=True):  # type: ignore[no-untyped-call]  # torch defines Tensor.split without annotations
                    a.copy_(b) if fresh else a.lerp_(b, w / total)  # one pass: a + (w / total) (b - a)
        self.weight = total


class RoundSum:
    def __init__(self, rda_names: Collection[str], pool: AccumulatorPool | None = None) -> None:
        self.rda = frozenset(rda_names)
        self.pool = pool
        self._weighted: _Sums | None = None
        self._equal: _Sums | None = _Sums()  # the fallback, while every weight so far is zero

    def add(self, values: Mapping[str, torch.Tensor], weight: float, norms: Mapping[str, float] | None = None) -> None:
        """Add one contribution (its tensors are not kept). `norms`: each tensor's L2 norm, if known."""
        if not (math.isfinite(weight) and weight >= 0):
            raise ValueError(f"weights must be finite and >= 0, got {weight}")
        if norms is None:
            norms = {name: norm(v) for name, v in values.items() if name in self.rda}
        if weight > 0:
            self._weighted = self._weighted or _Sums()
            self._weighted.add(values, norms, weight, self.rda, self.pool)
            self._equal = None
        elif self._equal is not None:
            self._equal.add(values, norms, 1.0, self.rda, self.pool)

    def release(self) -> None:
        """Hand the sums to the pool once the merge has used them; this RoundSum is done."""
        if self.pool is not None:
            for sums in (self._weighted, self._equal):
                for t in sums.tensors.values() if sums is not None else ():
                    self.pool.give(t)
        self._weighted = self._equal = None

    @property
    def equal_weights(self) -> bool:
        """Every weight was zero: the merge uses equal weights."""
        return self._weighted is None

    def result(self) -> dict[str, tuple[torch.Tensor, float, float]]:
        """Per tensor (D, s, |s D|): the merged update is s * D, never materialised here."""
        sums = self._weighted if self._weighted is not None else self._equal
        if sums is None or sums.weight <= 0:
            raise ValueError("cannot merge zero contributions")
        out = {}
        for name, acc in sums.tensors.items():
            d = norm(acc)
            if name in self.rda:
                mean_norm = sums.norm_sums.get(name, 0.0) / sums.weight
                out[name] = (acc, mean_norm / d if d > 0 else 0.0, mean_norm if d > 0 else 0.0)
            else:
                out[name] = (acc, 1.0, d)
        return out
