"""`ddiloco slurm-stop RUN_DIR`: end a run started with `ddiloco run --backend slurm --detach`."""

from __future__ import annotations

from pathlib import Path

import typer

from . import app


@app.command("slurm-stop")
def slurm_stop(
    run_dir: Path = typer.Argument(..., help="The run directory given to ddiloco run --backend slurm."),
) -> None:
    """Stop the run the clean way (learners send their work, shards checkpoint), then scancel its jobs."""
    from ..backends.base import Refused
    from ..backends.slurm import SlurmBackend
    from .output import TerminalOutput, refused, stderr

    try:
        jobs = SlurmBackend(TerminalOutput()).stop(run_dir)
    except Refused as exc:
        raise refused(exc) from None
    stderr.print(f"stopped {len(jobs)} jobs: {', '.join(jobs.values())}")
