"""One self-contained HTML page: each run's key figures side by side, and the plots embedded."""

from __future__ import annotations

import base64
import html
from collections.abc import Sequence
from pathlib import Path

from ..records.rundir import RunRecord

KEYS = (
    "method",
    "learners",
    "tokens",
    "eval_loss",
    "eval_accuracy",
    "goodput",
    "uptime",
    "utilization",
    "outer_steps",
    "rejected_contributions",
    "longest_gap_seconds",
    "stall_seconds_max",
    "sim_seconds",
    "wall_seconds",
)


def _cell(value: object) -> str:
    if isinstance(value, float):
        return f"{value:.4g}"
    return html.escape(str(value))


def write_page(records: Sequence[RunRecord], figures: Sequence[Path], path: Path) -> Path:
    keys = [k for k in KEYS if any(k in r.summary for r in records)]
    head = "".join(f"<th>{html.escape(r.label)}</th>" for r in records)
    rows = "".join(
        f"<tr><td>{k}</td>" + "".join(f"<td>{_cell(r.summary.get(k, ''))}</td>" for r in records) + "</tr>"
        for k in keys
    )
    images = "".join(
        f'<figure><img alt="{html.escape(p.stem)}" src="data:image/png;base64,'
        f'{base64.b64encode(p.read_bytes()).decode()}"><figcaption>{html.escape(p.stem)}</figcaption></figure>'
        for p in figures
    )
    sources = "".join(
        f"<li><code>{html.escape(str(r.path))}</code>: "
        f"<code>{html.escape(' '.join(r.config.get('argv', [])[1:]))}</code></li>"
        for r in records
    )
    page = f"""<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>ddiloco report</title>
<style>
body {{ font-family: system-ui, sans-serif; margin: 2em; color: #222; }}
table {{ border-collapse: collapse; margin-bottom: 1.5em; }}
td, th {{ border: 1px solid #ccc; padding: 0.3em 0.7em; text-align: right; }}
td:first-child {{ text-align: left; }}
figure {{ display: inline-block; margin: 0.5em; }}
img {{ max-width: 100%; }}
</style></head><body>
<h1>ddiloco report</h1>
<table><tr><th>metric</th>{head}</tr>{rows}</table>
{images}
<h2>Runs</h2><ul>{sources}</ul>
</body></html>
"""
    path.write_text(page)
    return path
