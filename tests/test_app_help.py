"""`meanfield --help` imports no JAX, nor does parsing any command's options.

A structural check, not a timing: each command runs in a fresh interpreter under
`-X importtime`, which lists every module imported; JAX must not be among them.
The `--help` of a command with a configuration file lists the keys of its schema,
which lives in its module (that imports JAX), so only its help imports it; the
other commands' `--help` import no JAX.
"""

import subprocess
import sys

import pytest

from meanfield._app.commands import COMMANDS

#: Commands whose `--help` reads no schema module (none, or their own parser's).
LIGHT = [c.name for c in COMMANDS if c.schema is None or c.own_parser is not None]


def _imported(stderr: str) -> set[str]:
    # Lines "import time: <self> | <cumulative> | <indented module name>".
    return {
        line.rsplit("|", 1)[1].strip()
        for line in stderr.splitlines()
        if line.startswith("import time:") and line.count("|") == 2
    }


def _heavy(argv: list[str], returncode: int) -> list[str]:
    argv = [sys.executable, "-X", "importtime", "-m", "meanfield", *argv]
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=120)
    assert proc.returncode == returncode, proc.stderr[-2000:]
    assert "usage: meanfield" in proc.stdout + proc.stderr
    modules = _imported(proc.stderr)
    assert "meanfield" in modules  # the listing is read correctly
    return sorted(m for m in modules if m.split(".")[0] in ("jax", "jaxlib"))


@pytest.mark.parametrize("command", [[], *([c] for c in LIGHT)], ids=str)
def test_help_imports_no_jax(command):
    heavy = _heavy([*command, "--help"], 0)
    assert not heavy, heavy[:5]


@pytest.mark.parametrize("command", [c.name for c in COMMANDS if c.name not in LIGHT])
def test_parsing_options_imports_no_jax(command):
    # A bad option stops in argparse, before the command's module is imported.
    heavy = _heavy([command, "--no-such-option"], 2)
    assert not heavy, heavy[:5]
