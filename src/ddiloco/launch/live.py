"""The live view of `ddiloco run` on stderr: one row per learner, and the global model's progress.

What it shows is `livestate.snapshot`, the same state the web dashboard serves: goodput and stalls
with the summary's definitions and window, a learner process "starting" until it registers and
"joining" until its first step, "reconnecting" when its session closed mid-run and "left" at the
run's end, trained tokens added up across restarts.
"""

from __future__ import annotations

import time

from rich.console import Group
from rich.table import Table
from rich.text import Text

from .livestate import snapshot
from .supervisor import Supervisor


def _ago(wall: float | None) -> str:
    return "-" if not wall else f"{time.time() - wall:.1f}s ago"


def render(sup: Supervisor, eval_loss: float | None) -> Group:
    st = snapshot(sup, eval_loss)
    budget = f" / {st['token_budget']}" if st["token_budget"] else ""
    clock = f"{st['elapsed']:.0f}s" + (f" / {st['duration']:g}s" if st["duration"] else "")
    head = Text(
        f"{st['method']}  t={clock}  global version {st['version']}  merges {st['merges']}  "
        f"tokens {st['tokens']}{budget}  goodput {st['goodput']:.2f}  stall max {st['stall_seconds_max']:.1f}s  "
        f"eval loss {'-' if eval_loss is None else f'{eval_loss:.3f}'}  restarts {st['learner_restarts']}"
        + ("  [stopping]" if st["stopping"] else "")
    )
    table = Table(show_header=True, header_style="bold", box=None)
    for col in (
        "learner",
        "state",
        "pid",
        "restarts",
        "step",
        "tokens trained",
        "merged tokens",
        "train loss",
        "last merge",
    ):
        table.add_column(col, justify="right" if col not in ("state",) else "left")
    for row in st["learners"]:
        loss = row.get("loss")
        table.add_row(
            str(row["id"]),
            row["state"],
            str(row["pid"] or "-"),
            str(row["restarts"]),
            str(row["step"] if row["step"] is not None else "-"),
            str(row["tokens_trained"] or "-"),
            f"{row['tokens_merged']:.0f}",
            "-" if loss is None else f"{loss:.3f}",
            _ago(row["last_merge_wall"]),
        )
    shards = Text(
        "  ".join(
            f"shard {s['index']}: {s['state']} pid {s['pid'] or '-'} restarts {s['restarts']}" for s in st["shards"]
        )
    )
    return Group(head, table, shards)
