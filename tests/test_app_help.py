"""`meanfield --help` and every `meanfield <command> --help` import no JAX.

A structural check, not a timing: each help runs in a fresh interpreter under
`-X importtime`, which lists every module imported; JAX must not be among them.
"""

import subprocess
import sys

import pytest

COMMANDS = [
    "demo",
    "gaussian",
    "lipschitz",
    "phase",
    "density",
    "simulate",
    "bench",
    "install-model",
]


def _imported(stderr: str) -> set[str]:
    # Lines "import time: <self> | <cumulative> | <indented module name>".
    return {
        line.rsplit("|", 1)[1].strip()
        for line in stderr.splitlines()
        if line.startswith("import time:") and line.count("|") == 2
    }


@pytest.mark.parametrize("command", [[], *([c] for c in COMMANDS)], ids=str)
def test_help_imports_no_jax(command):
    argv = [sys.executable, "-X", "importtime", "-m", "meanfield", *command, "--help"]
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.startswith("usage: meanfield")
    modules = _imported(proc.stderr)
    assert "meanfield" in modules  # the listing is read correctly
    heavy = sorted(m for m in modules if m.split(".")[0] in ("jax", "jaxlib"))
    assert not heavy, heavy[:5]
