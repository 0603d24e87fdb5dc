"""Failure traces: which learner is down from when to when.

One trace drives the chip-scale goodput simulator, the virtual-clock cluster and the real launcher,
so that the same chaos schedule can be compared across all three. The file format is CSV with the
header ``learner,down_at,up_at`` (seconds from the start of the run; ``up_at`` may be ``inf``), one
outage per row, so that a trace can be read and edited by hand.
"""

from __future__ import annotations

import csv
import io
import math
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

HEADER = ("learner", "down_at", "up_at")


@dataclass(frozen=True, order=True)
class Outage:
    """Learner `learner` is down during [down_at, up_at)."""

    down_at: float
    learner: int
    up_at: float

    def __post_init__(self) -> None:
        if self.learner < 0:
            raise ValueError(f"learner must be >= 0, got {self.learner}")
        if not (math.isfinite(self.down_at) and self.down_at >= 0):
            raise ValueError(f"down_at must be a finite time >= 0, got {self.down_at}")
        if not self.up_at > self.down_at:
            raise ValueError(f"up_at ({self.up_at}) must come after down_at ({self.down_at})")

    @property
    def duration(self) -> float:
        return self.up_at - self.down_at


@dataclass(frozen=True)
class FailureTrace:
    """A sorted list of outages; overlapping outages of one learner are merged."""

    outages: tuple[Outage, ...] = ()

    @classmethod
    def of(cls, outages: Iterable[Outage]) -> FailureTrace:
        merged: list[Outage] = []
        last_by_learner: dict[int, int] = {}
        for outage in sorted(outages, key=lambda o: (o.learner, o.down_at)):
            i = last_by_learner.get(outage.learner)
            if i is not None and outage.down_at <= merged[i].up_at:
                prev = merged[i]
                merged[i] = Outage(prev.down_at, prev.learner, max(prev.up_at, outage.up_at))
                continue
            last_by_learner[outage.learner] = len(merged)
            merged.append(outage)
        return cls(tuple(sorted(merged)))

    @property
    def learners(self) -> set[int]:
        return {o.learner for o in self.outages}

    def scaled(self, factor: float) -> FailureTrace:
        """The same trace with every time multiplied by `factor` (e.g. days to seconds of a run)."""
        if not factor > 0:
            raise ValueError(f"scale factor must be > 0, got {factor}")
        return FailureTrace(tuple(Outage(o.down_at * factor, o.learner, o.up_at * factor) for o in self.outages))

    def for_learners(self, num_learners: int) -> FailureTrace:
        """Only the outages of learners 0..num_learners-1."""
        return FailureTrace(tuple(o for o in self.outages if o.learner < num_learners))

    def is_down(self, learner: int, time: float) -> bool:
        return any(o.learner == learner and o.down_at <= time < o.up_at for o in self.outages)

    def downtime(self, learner: int, horizon: float) -> float:
        """Seconds learner is down within [0, horizon)."""
        return sum(
            max(0.0, min(o.up_at, horizon) - o.down_at)
            for o in self.outages
            if o.learner == learner and o.down_at < horizon
        )

    def to_csv(self) -> str:
        out = io.StringIO()
        writer = csv.writer(out, lineterminator="\n")
        writer.writerow(HEADER)
        for o in self.outages:
            writer.writerow((o.learner, repr(float(o.down_at)), repr(float(o.up_at))))
        return out.getvalue()

    def save(self, path: str | Path) -> None:
        Path(path).write_text(self.to_csv())

    @classmethod
    def from_csv(cls, text: str, source: str = "<trace>") -> FailureTrace:
        reader = csv.reader(io.StringIO(text))
        rows = [r for r in reader if r and not r[0].lstrip().startswith("#")]
        if not rows or tuple(c.strip() for c in rows[0]) != HEADER:
            raise ValueError(f"{source}: a failure trace must start with the header {','.join(HEADER)}")
        outages = []
        for lineno, row in enumerate(rows[1:], start=2):
            if len(row) != 3:
                raise ValueError(f"{source}:{lineno}: expected 3 columns, got {len(row)}: {row}")
            try:
                outages.append(Outage(float(row[1]), int(row[0]), float(row[2])))
            except ValueError as exc:
                raise ValueError(f"{source}:{lineno}: {exc}") from None
        return cls.of(outages)

    @classmethod
    def load(cls, path: str | Path) -> FailureTrace:
        path = Path(path)
        if not path.is_file():
            raise FileNotFoundError(f"failure trace {path} does not exist")
        return cls.from_csv(path.read_text(), source=str(path))


def random_trace(
    num_learners: int,
    horizon: float,
    mean_time_between_failures: float,
    mean_downtime: float,
    seed: int = 0,
) -> FailureTrace:
    """Each learner fails as a Poisson process and stays down an exponential time.

    The expected share of time a learner is down is mean_downtime / (mtbf + mean_downtime).
    """
    if num_learners < 1 or horizon <= 0 or mean_time_between_failures <= 0 or mean_downtime <= 0:
        raise ValueError("random_trace needs num_learners >= 1 and positive horizon, mtbf, downtime")
    rng = np.random.default_rng(seed)
    outages = []
    for learner in range(num_learners):
        t = float(rng.exponential(mean_time_between_failures))
        while t < horizon:
            down = float(rng.exponential(mean_downtime))
            outages.append(Outage(t, learner, t + max(down, 1e-9)))
            t += down + float(rng.exponential(mean_time_between_failures))
    return FailureTrace.of(outages)
