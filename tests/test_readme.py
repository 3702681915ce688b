"""README is a contract: every ```python block is self-contained and runs verbatim."""

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

README = Path(__file__).resolve().parents[1] / "README.md"
BLOCKS = re.findall(r"```python\n(.*?)```", README.read_text(), re.S)


def test_readme_has_python_blocks():
    assert len(BLOCKS) >= 8


@pytest.mark.parametrize("index", range(len(BLOCKS)))
def test_block_defines_every_name_it_uses(index):
    # Fast and static: no undefined names (ruff F821), so a block copied into a
    # fresh interpreter does not stop at its first line.
    ruff = shutil.which("ruff") or str(Path(sys.executable).with_name("ruff"))
    run = subprocess.run(
        [ruff, "check", "--select", "F821", "--stdin-filename", "block.py", "-"],
        input=BLOCKS[index],
        capture_output=True,
        text=True,
    )
    assert run.returncode == 0, run.stdout


# Second tier: the blocks run the tour's computations (about 2 minutes).
@pytest.mark.slow
@pytest.mark.parametrize("index", range(len(BLOCKS)))
def test_block_runs_verbatim_in_a_fresh_process(index, tmp_path):
    env = dict(os.environ, MPLBACKEND="Agg")
    run = subprocess.run(
        [sys.executable, "-c", BLOCKS[index]],
        cwd=tmp_path,  # files a block writes (tokens.gif) land here
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert run.returncode == 0, run.stderr[-3000:]
