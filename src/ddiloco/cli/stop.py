"""`ddiloco stop`: end a run from anywhere (the learners send what they hold and leave)."""

from __future__ import annotations

import typer

from . import app
from .output import user_error


@app.command("stop")
def stop(
    address: str = typer.Argument(
        ..., metavar="ADDRESS", help="Synchronizer address(es) host:port, comma-separated, one per shard."
    ),
    token: str | None = typer.Option(None, help="Shared secret (or $DDILOCO_TOKEN)."),
    reason: str = typer.Option("stopped from the command line", help="Why, for the synchronizer's log."),
    timeout: float = typer.Option(10.0, min=0.1, max=3600.0, help="Seconds to wait for each shard's answer."),
) -> None:
    """Ask every shard to end the run; exit code 1 when one does not answer."""
    from ..api.control import stop_run
    from ..wire import auth

    try:
        done = stop_run(address, auth.resolve_token(token), reason, timeout)
    except ValueError as exc:
        raise user_error(exc) from None
    except ConnectionError as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(1) from None
    for shard in done:
        typer.echo(f"{shard}: stopping")
