"""Output directories of the commands: one run at a time, never a mixed set."""

import json
import os
import subprocess
import sys

import pytest

from meanfield._app.report import LOCK, DirectoryInUse, Output


def test_a_live_run_holds_the_directory_and_a_dead_one_does_not(tmp_path):
    out = Output(tmp_path / "run")
    # Another live process (this test's parent) holds the lock.
    (out.dir / LOCK).write_text(f"{os.getppid()}\n")
    with pytest.raises(DirectoryInUse, match=r"is in use by another run \(pid"):
        out.lock()
    # A process that has exited: its lock is stale and taken over.
    gone = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"],
        capture_output=True,
        text=True,
        check=True,
    )
    (out.dir / LOCK).write_text(gone.stdout)
    out.lock()
    assert (out.dir / LOCK).read_text().strip() == str(os.getpid())
    out.unlock()
    assert not (out.dir / LOCK).exists()


def test_a_new_run_removes_the_previous_run_manifest_first(tmp_path):
    out = Output(tmp_path / "run")
    for name in ("old.png", "old.npz", "notes.txt", "checkpoint.npz", ".old.tmp-x.png"):
        (out.dir / name).write_text("x")
    (out.dir / "manifest.json").write_text(
        json.dumps({"files": ["old.png", "old.npz", "checkpoint.npz"]})
    )
    out.clear_previous(keep=("checkpoint.npz",))
    left = sorted(p.name for p in out.dir.iterdir())
    # The user's own file and the checkpoint stay; a killed writer's temp goes.
    assert left == ["checkpoint.npz", "notes.txt"]


def test_an_output_directory_that_cannot_exist_is_one_line(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("x")
    with pytest.raises(ValueError, match="cannot create the output directory"):
        Output(blocker / "out")


@pytest.mark.parametrize(
    "argv",
    [
        ["demo", "--quick"],
        ["bench", "--quick"],
    ],
    ids=["demo", "bench"],
)
def test_demo_and_bench_take_the_directory_lock(tmp_path, capsys, argv):
    # Two tours or two benchmarks into one directory exit 2 before any work.
    from meanfield._app.cli import main

    busy = tmp_path / "busy"
    busy.mkdir()
    (busy / LOCK).write_text(f"{os.getppid()}\n")  # a live process
    assert main([*argv, "--out", str(busy)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    command = argv[0]
    assert len(err) == 1 and err[0].startswith(f"meanfield {command}: error:")
    assert f"{str(busy)!r} is in use by another run" in err[0]
    assert sorted(p.name for p in busy.iterdir()) == [LOCK]


def test_locked_releases_the_directory_however_the_block_ends(tmp_path):
    out = Output(tmp_path / "run")
    with pytest.raises(RuntimeError), out.locked():
        assert (out.dir / LOCK).exists()
        raise RuntimeError
    assert not (out.dir / LOCK).exists()
