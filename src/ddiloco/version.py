"""The package's version: the one place it is written (pyproject.toml reads it from here), in a
module that imports nothing, so that any part (a run directory's record, a cluster's setup script)
can name it without importing the package's public surface."""

__version__ = "0.4.0"
