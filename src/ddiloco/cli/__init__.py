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
    """Import every sub-command module of this package; each registers itself on `app`."""
    import importlib
    import pkgutil

    for module in pkgutil.iter_modules(__path__):
        if not module.name.startswith("_") and module.name != "output":
            importlib.import_module(f"{__name__}.{module.name}")


def main() -> None:
    _register()
    app()
