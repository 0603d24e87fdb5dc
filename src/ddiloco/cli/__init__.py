"""The `ddiloco` command: one sub-command per module in this package."""

from __future__ import annotations

import typer

app = typer.Typer(
    name="ddiloco",
    help="Decoupled DiLoCo: resilient distributed pre-training.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)


@app.callback()
def _root() -> None:
    """Decoupled DiLoCo: resilient distributed pre-training."""


def _register() -> None:
    # Each sub-command lives in its own module and registers itself on `app`.
    import importlib

    for name in ("sim", "goodput"):
        try:
            importlib.import_module(f"ddiloco.cli.{name}")
        except ModuleNotFoundError as exc:  # a sub-command not written yet
            if exc.name != f"ddiloco.cli.{name}":
                raise


def main() -> None:
    _register()
    app()
