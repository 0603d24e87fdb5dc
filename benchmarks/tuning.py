"""A tuner that brackets: a method's best setting is trusted only once it lies strictly inside the grid
that was tried. A best value on the grid's edge says where the optimum is not, not where it is.

Settings are tuned one at a time (coordinate-wise), in the order given, each at the values already
chosen for those before it and the defaults of those after it: for the DiLoCo family the inner lr,
then the outer lr, then the outer momentum; for data-parallel the inner lr alone. With `passes` > 1
the round over the settings is repeated, each at the others' latest choices, until a round changes
nothing (at most `passes` rounds): a setting chosen late can move the best value of one chosen before
it (the outer momentum the outer lr's), and one round would leave a method of several settings less
tuned than data-parallel, whose one setting one round settles. Each setting starts
from three points around its default; while the lowest loss sits on an edge of the grid, one more
point is added past that edge, at most `max_widenings` times. What could not be bracketed is recorded
as such (`bracketed: false`), never passed off as an optimum; a best value at the edge of the
setting's domain (an outer momentum of 0) cannot be bracketed at all (`at_domain_edge: true`).

The objective is any callable (method, settings) -> final eval loss, lower is better; NaN and inf are
the worst loss there is and never chosen over a finite one. Every evaluation is kept in an optional
JSON results file, written atomically after each one and read on start, so a rerun (full-size runs
cost hours) evaluates nothing it already has. The file records the `context` it was made under (the
budget, model, ...): a file of another context is refused rather than mixed in. Several processes may
share one file (a sweep split over the machine's cores): each save merges, under a lock, what the file
holds with what this tuner has, and each evaluation first reads what the others have added.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import math
import os
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

Objective = Callable[[str, dict[str, float]], float]


@dataclass(frozen=True)
class Setting:
    """One tuned setting: its default (the first grid's centre, and its value while settings before
    it are tuned), its grid (`log`: `step` is a factor; `linear`: `step` is added), its domain
    [low, high], where the grid is clamped, and optionally `start`, a first grid other than the three
    points around the default (a benchmark's grid of earlier runs, so that they count)."""

    name: str
    default: float
    scale: str = "log"
    step: float = 2.0
    low: float = 0.0
    high: float = math.inf
    start: tuple[float, ...] = ()

    def shift(self, value: float, steps: int) -> float | None:
        """The grid point `steps` away from `value`, clamped to the domain; None past the domain's edge
        (or a log grid's 0)."""
        out = value * self.step**steps if self.scale == "log" else value + self.step * steps
        out = clean(min(max(out, self.low), self.high))
        if out == value or (self.scale == "log" and out <= 0):
            return None
        return out


def clean(x: float) -> float:
    """Six significant digits, so that 0.3 + 0.2 and 0.5 name the same grid point (and memo key)."""
    return float(f"{x:.6g}")


INNER_LR = Setting("inner_lr", 6e-3)
OUTER_LR = Setting("outer_lr", 0.7)
OUTER_MOMENTUM = Setting("outer_momentum", 0.5, scale="linear", step=0.2, low=0.0, high=0.95)
DATA_PARALLEL = (INNER_LR,)
DILOCO_FAMILY = (INNER_LR, OUTER_LR, OUTER_MOMENTUM)


def worst(loss: float | None) -> float:
    """The loss as tuning compares it: NaN, inf and a missing value are all +inf."""
    return float(loss) if loss is not None and math.isfinite(loss) else math.inf


class Tuner:
    """Brackets each method's settings on `objective`, memoised by (method, settings) in `path`."""

    def __init__(
        self,
        objective: Objective,
        path: Path | None = None,
        context: dict | None = None,
        max_widenings: int = 4,
        say: Callable[[str], None] = lambda line: None,
        passes: int = 1,
    ) -> None:
        self.objective, self.path, self.context = objective, path, context or {}
        self.max_widenings, self.say, self.passes = max_widenings, say, passes
        self.memo: dict[str, dict] = {}
        self.evaluated = 0  # objective calls made by this tuner (not taken from the file)
        if path is not None and path.exists():
            self._load(path)

    def tune(self, method: str, settings: Iterable[Setting], fixed: dict[str, float] | None = None) -> dict:
        """Each setting bracketed in turn, `fixed` ones held; the method's grids, choices (the fixed
        settings too) and every evaluation made."""
        settings = list(settings)
        chosen = {**(fixed or {}), **{s.name: clean(s.default) for s in settings}}
        out: dict = {"grid": {}, "chosen": chosen, "bracketed": {}, "at_domain_edge": {}, "passes": 0}
        for _ in range(max(1, self.passes)):
            changed = False
            for s in settings:  # each grid and flag is that of the last round
                r = self._bracket(method, s, chosen)
                changed |= r["chosen"] != chosen[s.name]
                chosen[s.name] = r["chosen"]
                out["grid"][s.name], out["bracketed"][s.name] = r["grid"], r["bracketed"]
                out["at_domain_edge"][s.name] = r["at_domain_edge"]
            out["passes"] += 1
            if not changed:
                break
        out["losses"] = [e for e in self.memo.values() if e["method"] == method]
        return out

    def _bracket(self, method: str, s: Setting, fixed: dict[str, float]) -> dict:
        """One setting: the grid widened past the edge the best sits on until it is strictly inside."""
        centre = fixed[s.name]
        first = [clean(v) for v in s.start] or [s.shift(centre, -1), centre, s.shift(centre, 1)]
        grid = sorted({v for v in first if v is not None})
        widenings = 0
        while True:
            losses = [self.loss(method, {**fixed, s.name: v}) for v in grid]
            best = min(range(len(grid)), key=lambda i: (losses[i], i))
            inside = 0 < best < len(grid) - 1 and math.isfinite(losses[best])
            step = -1 if best == 0 else 1
            past = s.shift(grid[best], step)
            if inside or past is None or widenings == self.max_widenings:
                break
            grid = sorted([*grid, past])
            widenings += 1
        at_edge = not inside and past is None
        if not inside:
            why = "the domain's edge" if at_edge else f"{widenings} widenings"
            self.say(f"tuning {method}: {s.name} not bracketed ({why}): best {grid[best]:g} on the grid's edge")
        return {"grid": grid, "chosen": grid[best], "bracketed": inside, "at_domain_edge": at_edge}

    def loss(self, method: str, settings: dict[str, float]) -> float:
        """The objective at these settings, from the memo if there; a new one is saved at once."""
        key = json.dumps({"method": method, **settings}, sort_keys=True)
        if key not in self.memo and self.path is not None and self.path.exists():
            with self._locked():
                self._load(self.path)  # another process on the same file may have run it meanwhile
        if key not in self.memo:
            value = worst(self.objective(method, dict(settings)))
            self.evaluated += 1
            self.memo[key] = {"method": method, "settings": dict(settings), "loss": _stored(value)}
            self.say(f"tuning {method}: {_show(settings)} -> eval loss {value:.4f}")
            self._save()
        return worst(self.memo[key]["loss"])

    def _load(self, path: Path) -> None:
        data = json.loads(path.read_text())
        if data.get("context", {}) != json.loads(json.dumps(self.context)):
            raise ValueError(f"{path} holds tuning runs of another configuration: use another file")
        for e in data.get("evaluations", []):
            self.memo[json.dumps({"method": e["method"], **e["settings"]}, sort_keys=True)] = e

    @contextlib.contextmanager
    def _locked(self):  # noqa: ANN202
        """An exclusive lock on the results file's lock file, for the processes sharing it."""
        assert self.path is not None
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.path.with_suffix(self.path.suffix + ".lock"), "a") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            yield

    def _save(self) -> None:
        if self.path is None:
            return
        with self._locked():
            if self.path.exists():
                self._load(self.path)  # keep what other processes on this file saved since
            tmp = self.path.with_suffix(self.path.suffix + f".{os.getpid()}.tmp")
            tmp.write_text(json.dumps({"context": self.context, "evaluations": list(self.memo.values())}, indent=1))
            os.replace(tmp, self.path)


def _stored(loss: float) -> float | None:
    """A loss as the JSON file holds it: null for one that is not finite (JSON has no NaN)."""
    return loss if math.isfinite(loss) else None


def _show(settings: dict[str, float]) -> str:
    return ", ".join(f"{k} {v:g}" for k, v in settings.items())
