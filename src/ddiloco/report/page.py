"""One self-contained HTML page: the scenario and the headline first (when the runs have a story), then
each plot with its title and one line on what to see, then the runs' numbers under human names."""

from __future__ import annotations

import base64
import html
from collections.abc import Sequence
from pathlib import Path

from ..records.rundir import RunRecord
from .story import Story, labels

ROWS = {  # summary key -> what a person calls it
    "learners": "learners",
    "tokens": "tokens trained",
    "eval_loss": "eval loss at the end",
    "eval_accuracy": "eval accuracy at the end",
    "goodput": "goodput (useful chip time / all chip time)",
    "uptime": "uptime (time the model was advancing)",
    "utilization": "utilization (chip time spent computing)",
    "outer_steps": "outer steps (merges)",
    "rejected_contributions": "contributions refused",
    "longest_gap_seconds": "longest gap between steps (s)",
    "stall_seconds_max": "longest stall (s)",
    "sim_seconds": "simulated seconds to the budget",
    "wall_seconds": "wall seconds",
}

CAPTIONS = {  # figure stem (or its prefix) -> (title, what to see)
    "loss_vs_tokens": (
        "Loss against tokens",
        "Quality per token: lower is better at the same amount of data; the gap between the curves at the "
        "right end is the price (or gain) of each method at equal tokens.",
    ),
    "loss_vs_time": (
        "Loss against time",
        "What a user waits for: the curve that is lowest at a moment is the best model one could have then; "
        "the dashed line marks the moment the headline compares.",
    ),
    "goodput": (
        "Goodput and uptime",
        "The share of chip time that became merged work (solid) and of time the model was advancing (dashed).",
    ),
    "timeline": (
        "Learners up and down, and what the run did",
        "Green bars: when each learner was up (the same failures for every method). Below: each merge "
        "(DiLoCo methods) or how many workers all-reduced together (data-parallel; 0 while the job stalls).",
    ),
}


def _cell(value: object) -> str:
    if isinstance(value, float):
        return f"{value:.4g}"
    return html.escape(str(value))


def _figure(path: Path) -> str:
    key = next((k for k in CAPTIONS if path.stem == k or path.stem.startswith(k + "_")), None)
    title, note = CAPTIONS.get(key or "", (path.stem, ""))
    data = base64.b64encode(path.read_bytes()).decode()
    return (
        f'<section class="figure"><h3>{html.escape(title)}</h3><p class="note">{html.escape(note)}</p>'
        f'<img alt="{html.escape(title)}" src="data:image/png;base64,{data}"></section>'
    )


def write_page(records: Sequence[RunRecord], figures: Sequence[Path], path: Path, story: Story | None = None) -> Path:
    names = labels(records)
    keys = [k for k in ROWS if any(k in r.summary for r in records)]
    head = "".join(f"<th>{html.escape(n)}</th>" for n in names)
    rows = "".join(
        f"<tr><td>{html.escape(ROWS[k])}</td>"
        + "".join(f"<td>{_cell(r.summary.get(k, ''))}</td>" for r in records)
        + "</tr>"
        for k in keys
    )
    told = ""
    if story is not None:
        told = f'<p class="scenario">{html.escape(story.scenario)}</p>'
        told += f'<p class="headline">{html.escape(story.headline)}</p>'
        if story.moment is not None:
            moment = story.moment_label or f"{story.moment:.0f} s"
            told += f'<p class="moment">Marked on the loss-against-time plot: {html.escape(moment)}.</p>'
    sources = "".join(
        f"<li>{html.escape(n)}: <code>{html.escape(str(r.path))}</code>, "
        f"<code>{html.escape(' '.join(str(a) for a in r.config.get('argv', [])[1:]))}</code></li>"
        for n, r in zip(names, records, strict=True)
    )
    page = f"""<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>ddiloco report</title>
<style>
body {{ font-family: system-ui, sans-serif; margin: 2em; color: #222; max-width: 60em; }}
.scenario {{ font-size: 1.05em; }}
.headline {{ font-size: 1.15em; font-weight: 600; border-left: 4px solid #2a7; padding-left: 0.7em; }}
.note {{ color: #555; margin-top: 0; }}
table {{ border-collapse: collapse; margin-bottom: 1.5em; }}
td, th {{ border: 1px solid #ccc; padding: 0.3em 0.7em; text-align: right; }}
td:first-child {{ text-align: left; }}
img {{ max-width: 100%; }}
</style></head><body>
<h1>ddiloco report</h1>
{told}
<h2>Plots</h2>
{"".join(_figure(p) for p in figures)}
<h2>Numbers</h2>
<table><tr><th></th>{head}</tr>{rows}</table>
<h2>Runs</h2><ul>{sources}</ul>
</body></html>
"""
    path.write_text(page)
    return path
