"""The synchronizer's books: which learner's work reached the global model, and where each learner's
data stream must resume.

Definitions match the simulator's ledger (`ddiloco.sim.ledger`): a merge that admits a learner's
snapshot of fragment p counts that work (its steps, tokens, compute seconds) for p's share of the
parameters. So

    tokens_merged  = sum over admitted work of tokens  * share(p)
    useful seconds = sum over admitted work of seconds * share(p)    (goodput = useful / allocated)

Data positions: every contribution carries the learner's stream position after its snapshot step.
A learner that restarts resumes at the furthest position any of its merged (or already admitted,
still open) snapshots reached: batches before it are never trained into the model twice, batches
after it reached nothing and are trained again. `double_merged_steps` counts any step that a merge
would have counted twice for the same fragment; it must stay 0.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field

from ..core import FragmentPlan, Merged

MAX_INCARNATIONS = 16  # token counts kept apart per learner; older incarnations are summed
EARLIER = "*earlier"


@dataclass
class PendingWork:
    """What the synchronizer knows about a contribution beyond the core's `Contribution`."""

    position: int
    incarnation: str
    span_start: float  # wall time the work began (the learner last received the fragment)
    snapshot_wall: float
    final: bool = False  # sent by a learner that is finishing: it leaves once this is merged


@dataclass
class LearnerBook:
    merged_position: int = 0
    tokens_merged: float = 0.0
    useful_seconds: float = 0.0
    contributions: int = 0
    rejected: int = 0
    tokens_reported: dict[str, int] = field(default_factory=dict)  # incarnation -> tokens trained
    merged_upto: dict[str, int] = field(default_factory=dict)  # fragment -> furthest merged position
    last_merge_wall: float | None = None

    @property
    def tokens_trained(self) -> int:
        return sum(self.tokens_reported.values())


class MergeLedger:
    def __init__(self, plan: FragmentPlan, started_wall: float) -> None:
        self.plan = plan
        self.started_wall = started_wall
        self.books: dict[int, LearnerBook] = {}
        self.pending: dict[tuple[int, int, int], PendingWork] = {}
        self.merges = 0
        self.contributions = 0
        self.rejected = 0
        self.tokens_merged = 0.0
        self.tokens_refused = 0.0  # share-weighted tokens of contributions refused (not duplicates)
        self.useful_seconds = 0.0
        self.double_merged_steps = 0
        self.last_merge_wall: float | None = None
        self.first_join_wall: float | None = None  # stalls count from here: start-up is not a stall
        self.stall_max = 0.0

    def on_join(self, wall: float) -> None:
        if self.first_join_wall is None:
            self.first_join_wall = wall

    def book(self, learner: int) -> LearnerBook:
        return self.books.setdefault(learner, LearnerBook())

    # --- events ---------------------------------------------------------------------------------
    def contributed(self, learner: int, fragment: int, base_version: int, work: PendingWork) -> None:
        self.pending[(learner, fragment, base_version)] = work

    def forget(self, learner: int, fragment: int, base_version: int) -> None:
        self.pending.pop((learner, fragment, base_version), None)

    def report_tokens(self, learner: int, incarnation: str, tokens: int) -> None:
        book = self.book(learner)
        reported = book.tokens_reported
        if incarnation not in reported and len(reported) >= MAX_INCARNATIONS:
            # Bounded per learner however often it restarts: the oldest counts are folded together.
            oldest = next(k for k in reported if k != EARLIER)
            reported[EARLIER] = reported.get(EARLIER, 0) + reported.pop(oldest)
        reported[incarnation] = max(int(tokens), reported.get(incarnation, 0))

    def on_rejected(self, learner: int) -> None:
        self.rejected += 1
        self.book(learner).rejected += 1

    def on_merge(self, merged: Merged, wall: float) -> list[dict]:
        """Book a merge; returns one record per admitted learner for the event log."""
        p = merged.fragment
        share = self.plan.share(p)
        self.merges += 1
        self.stall_max = max(self.stall_max, wall - (self.last_merge_wall or self.first_join_wall or wall))
        self.last_merge_wall = wall
        records = []
        # oldest work first: a learner's late work precedes its on-time work in its data stream
        for w in sorted(merged.admitted, key=lambda w: w.base_version if w.base_version >= 0 else merged.version - 1):
            base = w.base_version if w.base_version >= 0 else merged.version - 1
            info = self.pending.pop((w.learner, p, base), None)
            book = self.book(w.learner)
            book.tokens_merged += w.tokens * share
            book.useful_seconds += w.seconds * share
            book.contributions += 1
            book.last_merge_wall = wall
            self.contributions += 1
            self.tokens_merged += w.tokens * share
            self.useful_seconds += w.seconds * share
            record: dict[str, object] = {
                "learner": w.learner,
                "steps": w.steps,
                "tokens": w.tokens,
                "seconds": w.seconds,
                "weight": w.weight,
                "share": share,
                "late": merged.version - 1 - base,  # versions it missed (0: merged on time)
            }
            if info is not None:
                start = info.position - w.steps
                upto = book.merged_upto.get(str(p), 0)
                if start < upto:
                    self.double_merged_steps += min(w.steps, upto - start)
                book.merged_upto[str(p)] = max(upto, info.position)
                book.merged_position = max(book.merged_position, info.position)
                record.update(
                    position=info.position,
                    span_start=info.span_start,
                    snapshot_wall=info.snapshot_wall,
                    incarnation=info.incarnation,
                )
            records.append(record)
        return records

    def resume_position(self, learner: int, open_positions: list[int]) -> int:
        """Where a restarted learner's data stream resumes (see the module docstring)."""
        return max([self.book(learner).merged_position, *open_positions])

    # --- totals ---------------------------------------------------------------------------------
    @property
    def tokens_reported(self) -> int:
        return sum(b.tokens_trained for b in self.books.values())

    def stall(self, now_wall: float) -> float:
        """The longest time without a merge since the first learner joined (0 before anyone did)."""
        origin = self.last_merge_wall or self.first_join_wall
        return self.stall_max if origin is None else max(self.stall_max, now_wall - origin)

    def state_dict(self) -> dict:
        return {
            "started_wall": self.started_wall,
            "books": {str(m): asdict(b) for m, b in self.books.items()},
            "merges": self.merges,
            "contributions": self.contributions,
            "rejected": self.rejected,
            "tokens_merged": self.tokens_merged,
            "tokens_refused": self.tokens_refused,
            "useful_seconds": self.useful_seconds,
            "double_merged_steps": self.double_merged_steps,
            "last_merge_wall": self.last_merge_wall,
            "first_join_wall": self.first_join_wall,
            "stall_max": self.stall_max,
        }

    def load_state_dict(self, state: dict) -> None:
        """Restore from a manifest; ValueError, naming the field, for anything out of range (a count a
        checkpoint could not have written, or one saved before the synchronizer checked its input)."""
        try:
            books = {int(m): LearnerBook(**b) for m, b in state.get("books", {}).items()}
            for m, b in books.items():
                _check(
                    f"books.{m}",
                    m,
                    b.merged_position,
                    b.contributions,
                    b.rejected,
                    *b.tokens_reported.values(),
                    *b.merged_upto.values(),
                    floats=(b.tokens_merged, b.useful_seconds),
                )
            counts = {k: int(state.get(k, 0)) for k in ("merges", "contributions", "rejected", "double_merged_steps")}
            reals = {
                k: float(state.get(k, 0.0)) for k in ("tokens_merged", "tokens_refused", "useful_seconds", "stall_max")
            }
            _check("ledger", *counts.values(), floats=reals.values())
            started = float(state.get("started_wall", self.started_wall))
            last = state.get("last_merge_wall")
            joined = state.get("first_join_wall")
            _check("ledger wall times", floats=[started] + [float(w) for w in (last, joined) if w is not None])
        except (TypeError, ValueError, OverflowError, AttributeError) as exc:
            raise ValueError(f"the checkpoint's ledger is malformed: {str(exc)[:200]}") from None
        self.books, self.started_wall, self.last_merge_wall, self.first_join_wall = books, started, last, joined
        for key, value in {**counts, **reals}.items():
            setattr(self, key, value)
        self.pending.clear()


_MAX = 2**53


def _check(where: str, *counts: object, floats: Iterable[object] = ()) -> None:
    for c in counts:
        if not isinstance(c, int) or isinstance(c, bool) or not 0 <= c <= _MAX:
            raise ValueError(f"{where}: count {str(c)[:40]} is not an integer in [0, 2**53]")
    for f in floats:
        if not isinstance(f, (int, float)) or not math.isfinite(f) or not 0 <= f <= 1e15:
            raise ValueError(f"{where}: value {str(f)[:40]} is not a finite number in [0, 1e15]")
