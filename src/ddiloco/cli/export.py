"""`ddiloco export`: the global model of a run as a plain safetensors state dict (and, with a Hugging
Face config, a folder that `from_pretrained` loads)."""

from __future__ import annotations

from pathlib import Path

import typer

from . import app
from .output import user_error


@app.command("export")
def export(
    source: Path = typer.Argument(
        ...,
        metavar="RUN_OR_CHECKPOINT_DIR",
        help="A run directory (its sync-*/ checkpoints) or one synchronizer --checkpoint-dir.",
    ),
    out: Path = typer.Option(..., help="Folder to write model.safetensors (and config.json) into."),
    hf_config: Path | None = typer.Option(
        None,
        help="A Hugging Face config.json (or the folder holding it): "
        "copied beside the weights so that from_pretrained(OUT) loads them.",
    ),
) -> None:
    """Write the global parameters (no optimizer state) of a run or checkpoint."""
    from ..api.export import export_global
    from ..synchronizer.checkpoint import CheckpointError

    try:
        weights = export_global(source, out, hf_config)
    except (ValueError, CheckpointError, OSError) as exc:
        raise user_error(exc) from None
    typer.echo(str(weights))
