"""The `resaware` command: a thin layer over the Python API."""

from resaware.cli.main import main

__all__ = ["main"]
