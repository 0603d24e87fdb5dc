"""The `ddiloco` command: one sub-command per module in this package."""

from __future__ import annotations

import sys

import typer

from .config_file import apply_aliases, split_config

app = typer.Typer(
    name="ddiloco",
    help="Decoupled DiLoCo: resilient distributed pre-training.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)


def _print_version(value: bool) -> None:
    if value:
        from .. import __version__

        typer.echo(f"ddiloco {__version__}")
        raise typer.Exit()


@app.callback()
def _root(
    version: bool = typer.Option(
        False, "--version", is_eager=True, callback=_print_version, help="Print the version and exit."
    ),
) -> None:
    """Decoupled DiLoCo: resilient distributed pre-training. Every command also takes
    --config FILE.toml (keys spelled like its flags; flags override the file)."""


def _register() -> None:
    """Import every sub-command module of this package; each registers itself on `app`."""
    import importlib
    import pkgutil

    for module in pkgutil.iter_modules(__path__):
        if not module.name.startswith("_") and module.name not in ("output", "options", "config_file"):
            importlib.import_module(f"{__name__}.{module.name}")


def main() -> None:
    _register()
    args = apply_aliases(sys.argv[1:])
    try:
        args, defaults = split_config(args, app)
    except ValueError as exc:
        typer.echo(f"Error: {exc}", err=True)
        sys.exit(2)
    app(args=args, default_map=defaults)
