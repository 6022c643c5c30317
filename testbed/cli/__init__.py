"""The `testbed` command."""

from testbed.cli.main import entry, main

__all__ = ["entry", "main"]
