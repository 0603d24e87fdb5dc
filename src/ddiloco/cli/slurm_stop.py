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
    from ..cluster.slurm import SlurmError
    from ._slurm import stop_from_run_dir
    from .output import stderr, user_error

    try:
        jobs = stop_from_run_dir(run_dir)
    except (FileNotFoundError, ValueError, SlurmError) as exc:
        raise user_error(exc) from None
    stderr.print(f"stopped {len(jobs)} jobs: {', '.join(jobs.values())}")
