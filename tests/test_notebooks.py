"""Every notebook runs in small mode (SMOKE_TEST=1), so examples cannot rot."""

import os
import runpy
from pathlib import Path

import jax
import pytest
from helpers import skip_if_an_extra_is_missing

NOTEBOOKS = sorted((Path(__file__).parent.parent / "notebooks").glob("[0-9][0-9]_*.py"))


# Second tier (make test-slow): the eight notebooks take ~140 s of compiles together.
@pytest.mark.slow
@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_notebook_runs_in_smoke_mode(path, monkeypatch):
    monkeypatch.setenv("SMOKE_TEST", "1")
    monkeypatch.setenv("MPLBACKEND", "Agg")
    x64 = jax.config.jax_enable_x64
    try:
        runpy.run_path(str(path), run_name="__main__")
    except ImportError as err:  # a tutorial on an extra, without it
        skip_if_an_extra_is_missing(str(err))
        raise
    finally:
        jax.config.update("jax_enable_x64", x64)


def test_notebooks_exist():
    assert len(NOTEBOOKS) >= 2
    assert os.path.basename(NOTEBOOKS[0]).startswith("01_")
