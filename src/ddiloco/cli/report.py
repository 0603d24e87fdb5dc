"""`ddiloco report`: plots and one HTML page from run directories (`--run-dir` of sim and run)."""

from __future__ import annotations

from pathlib import Path

import typer

from . import app


@app.command("report")
def report(
    run_dirs: list[Path] = typer.Argument(
        ...,
        metavar="RUN_DIR...",
        help="Run directories, or folders of them (the demo's); several are overlaid for comparison.",
    ),
    out: Path | None = typer.Option(
        None, help="Where to write the PNGs and report.html (default: the first run directory's report/)."
    ),
) -> None:
    """Plot eval loss against tokens and time, merges, learners up and down, goodput; write report.html."""
    from ..records.rundir import load_run, run_dirs_in
    from ..report.page import write_page
    from ..report.plots import write_figures
    from ..report.story import load_story

    try:
        records = [load_run(d) for given in run_dirs for d in run_dirs_in(given)]
    except ValueError as exc:
        raise typer.BadParameter(str(exc), param_hint="RUN_DIR") from None
    out = out or run_dirs[0] / "report"
    story = load_story(run_dirs[0]) if len(run_dirs) == 1 else None  # a folder of runs the demo told
    try:
        figures = write_figures(records, out, story)
    except OSError as exc:
        raise typer.BadParameter(f"{out}: cannot write there ({exc.strerror})", param_hint="--out") from None
    page = write_page(records, figures, out / "report.html", story)
    for path in [*figures, page]:
        typer.echo(str(path))
