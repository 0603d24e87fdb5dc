"""The live view of `ddiloco run` on stderr: one row per learner, and the global model's progress.

Goodput "so far" is the synchronizers' merged compute seconds over the learners' allocated time
since the first one joined, the same definition as the final summary.
"""

from __future__ import annotations

import time

from rich.console import Group
from rich.table import Table
from rich.text import Text

from .supervisor import Supervisor


def _ago(wall: float | None) -> str:
    return "-" if not wall else f"{time.time() - wall:.1f}s ago"


def render(sup: Supervisor, eval_loss: float | None) -> Group:
    statuses = [s.status for s in sup.shards if s.status]
    version = sum(int(s.get("version_sum", 0)) for s in statuses)
    merges = sum(int(s.get("merges", 0)) for s in statuses)
    useful = sum(float(s.get("useful_seconds", 0.0)) for s in statuses)
    started = min((float(s.get("started_wall", time.time())) for s in statuses), default=time.time())
    window = max(1e-9, time.time() - started)
    goodput = useful / (sup.config.learners * window)
    stall = max((float(s.get("stall_seconds_max", 0.0)) for s in statuses), default=0.0)
    tokens = max((int(s.get("tokens_reported", 0)) for s in statuses), default=0)
    budget = f" / {sup.config.tokens}" if sup.config.tokens else ""
    head = Text(
        f"{sup.config.method}  t={sup.elapsed():.0f}s  global version {version}  merges {merges}  "
        f"tokens {tokens}{budget}  goodput {goodput:.2f}  stall max {stall:.1f}s  "
        f"eval loss {'-' if eval_loss is None else f'{eval_loss:.3f}'}  restarts {sup.learner_restarts}"
        + ("  [stopping]" if sup.stopping else "")
    )
    table = Table(show_header=True, header_style="bold", box=None)
    for col in ("learner", "state", "pid", "restarts", "step", "tokens", "merged tokens", "last merge"):
        table.add_column(col, justify="right" if col not in ("state",) else "left")
    for row in sup.learner_rows():
        table.add_row(
            str(row["id"]), row["state"], str(row["pid"] or "-"), str(row["restarts"]),
            str(row["step"] if row["step"] is not None else "-"), str(row["tokens"] or "-"),
            f"{row['tokens_merged']:.0f}", _ago(row["last_merge_wall"]),
        )
    shards = Text("  ".join(f"shard {s.index}: {s.state} pid {s.child.pid if s.child else '-'} restarts {s.restarts}"
                            for s in sup.shards))
    return Group(head, table, shards)
