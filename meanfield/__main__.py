"""`python -m meanfield <command>`: same as the `meanfield` command."""

from ._app.cli import entry

entry()
