"""The live view of `ddiloco run` on stderr: one row per learner, and the global model's progress.

Goodput "so far" is the synchronizers' merged compute seconds over the learners' allocated time
since the first one joined, and the longest stall counts from that join too: the same definitions
and window as the final summary. A learner process shows "starting" until it registers and
"joining" until its first step; its trained tokens add up across restarts.
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
    joined = [float(s["first_join_wall"]) for s in statuses if s.get("first_join_wall")]
    # the summary's window: from the first join on (learners' start-up is not counted against goodput)
    window = time.time() - min(joined) if joined else 0.0
    goodput = useful / (sup.config.learners * window) if window > 0 else 0.0
    stall = max((float(s.get("stall_seconds_max", 0.0)) for s in statuses), default=0.0)
    tokens = max((int(s.get("tokens_reported", 0)) for s in statuses), default=0)
    budget = f" / {sup.config.tokens}" if sup.config.tokens else ""
    clock = f"{sup.elapsed():.0f}s" + (f" / {sup.config.duration:g}s" if sup.config.duration else "")
    head = Text(
        f"{sup.config.method}  t={clock}  global version {version}  merges {merges}  "
        f"tokens {tokens}{budget}  goodput {goodput:.2f}  stall max {stall:.1f}s  "
        f"eval loss {'-' if eval_loss is None else f'{eval_loss:.3f}'}  restarts {sup.learner_restarts}"
        + ("  [stopping]" if sup.stopping else "")
    )
    table = Table(show_header=True, header_style="bold", box=None)
    for col in ("learner", "state", "pid", "restarts", "step", "tokens trained", "merged tokens", "train loss",
                "last merge"):
        table.add_column(col, justify="right" if col not in ("state",) else "left")
    for row in sup.learner_rows():
        loss = row.get("loss")
        table.add_row(
            str(row["id"]), row["state"], str(row["pid"] or "-"), str(row["restarts"]),
            str(row["step"] if row["step"] is not None else "-"), str(row["tokens_trained"] or "-"),
            f"{row['tokens_merged']:.0f}", "-" if loss is None else f"{loss:.3f}", _ago(row["last_merge_wall"]),
        )
    shards = Text("  ".join(f"shard {s.index}: {s.state} pid {s.child.pid if s.child else '-'} restarts {s.restarts}"
                            for s in sup.shards))
    return Group(head, table, shards)
