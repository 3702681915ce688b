"""The heap-top padding set when meanfield is imported (`meanfield._heap`)."""

import os
import platform
import subprocess
import sys

import pytest

CHECK = "import meanfield._heap as h; print(h.keep_top(), h.keep_top())"


def _keep_top(value):
    env = {k: v for k, v in os.environ.items() if k != "MEANFIELD_HEAP_TOP_PAD"}
    if value is not None:
        env["MEANFIELD_HEAP_TOP_PAD"] = value
    proc = subprocess.run(
        [sys.executable, "-c", CHECK], capture_output=True, text=True, env=env
    )
    assert proc.returncode == 0, proc.stderr
    return proc.stdout.split()


@pytest.mark.skipif(
    platform.system() != "Linux" or platform.libc_ver()[0] != "glibc",
    reason="M_TOP_PAD is a glibc setting",
)
def test_glibc_keeps_16_mib_unless_told_otherwise():
    assert _keep_top(None) == ["16777216"] * 2  # set once, then remembered
    assert _keep_top("1048576") == ["1048576"] * 2
    for off in ("0", "off", "no", "not-a-number", "-5"):
        assert _keep_top(off) == ["None"] * 2, off


@pytest.mark.skipif(
    platform.system() != "Linux" or platform.libc_ver()[0] != "glibc",
    reason="M_TOP_PAD is a glibc setting",
)
def test_import_sets_it_unless_a_backend_already_runs():
    """After XLA's client has allocated, the call is skipped (measured harmful)."""
    env = {k: v for k, v in os.environ.items() if k != "MEANFIELD_HEAP_TOP_PAD"}
    report = "import meanfield._heap as h; print(h._state['pad'])"
    started = "import jax; jax.numpy.zeros(1); "
    for before, want in (("", "16777216"), (started, "None")):
        proc = subprocess.run(
            [sys.executable, "-c", before + "import meanfield; " + report],
            capture_output=True,
            text=True,
            env=env,
        )
        assert proc.returncode == 0, proc.stderr
        assert proc.stdout.strip() == want, before
