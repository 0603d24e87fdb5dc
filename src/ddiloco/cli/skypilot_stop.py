"""`ddiloco skypilot-stop RUN_DIR`: end a run started with `ddiloco run --backend skypilot --detach`."""

from __future__ import annotations

from pathlib import Path

import typer

from . import app


@app.command("skypilot-stop")
def skypilot_stop(
    run_dir: Path = typer.Argument(..., help="The run directory given to ddiloco run --backend skypilot."),
) -> None:
    """Stop the run the clean way (learners send their work, shards checkpoint), then cancel the
    learners' managed jobs and take the synchronizer's cluster down."""
    from ..backends.base import Refused
    from ..backends.skypilot import SkyPilotBackend
    from .output import TerminalOutput, refused, stderr

    try:
        run = SkyPilotBackend(TerminalOutput()).stop(run_dir)
    except Refused as exc:
        raise refused(exc) from None
    stderr.print(f"stopped {run['cluster']} and {len(run['jobs'])} learner jobs")
