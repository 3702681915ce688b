"""Output directories of the commands: one run at a time, never a mixed set."""

import contextlib
import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from meanfield._app.report import LOCK, DirectoryInUse, Output, UnusableDirectory


@contextlib.contextmanager
def _live_run(directory):
    """Another process that holds `directory`'s lock, as a run does, meanwhile."""
    code = (
        "import sys; from meanfield._app.report import Output; "
        "Output(sys.argv[1]).lock(); print('locked', flush=True); sys.stdin.read()"
    )
    proc = subprocess.Popen(
        [sys.executable, "-c", code, str(directory)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout.readline().strip() == "locked"
        yield proc
    finally:
        proc.kill()  # killed, as by the OOM killer: the lock file stays
        proc.wait()
        proc.stdin.close()
        proc.stdout.close()


def _lock_pid(directory) -> int:
    return json.loads((directory / LOCK).read_text())["pid"]


def test_a_live_run_holds_the_directory_and_a_dead_one_does_not(tmp_path):
    out = Output(tmp_path / "run")
    with _live_run(out.dir) as other:
        # The message says how to clear a lock that no run uses.
        lock = str(out.dir / LOCK)
        with pytest.raises(
            DirectoryInUse, match=r"is in use by another run \(pid"
        ) as e:
            out.lock()
        assert f"pid {other.pid}" in str(e.value) and f"delete {lock!r}" in str(e.value)
        assert "if no meanfield run is using this directory" in str(e.value)
    # Its process was killed: the lock is stale and taken over.
    assert _lock_pid(out.dir) == other.pid
    out.lock()
    assert _lock_pid(out.dir) == os.getpid()
    out.unlock()
    assert not (out.dir / LOCK).exists()


def test_a_lock_whose_pid_now_belongs_to_another_program_is_taken_over(tmp_path):
    # A run was killed and its pid reused: by a program that is no meanfield
    # run, or by one started after the lock was written. Neither holds it.
    out = Output(tmp_path / "run")
    sleeper = subprocess.Popen(["sleep", "60"])
    # Popen returns when exec has closed its error pipe, which the kernel does
    # before it installs the new command line: under load /proc still shows
    # the forking Python for a moment. Wait until it shows `sleep`.
    cmdline = Path("/proc", str(sleeper.pid), "cmdline")
    deadline = time.monotonic() + 10
    while (
        cmdline.exists()  # Linux; elsewhere the lock cannot read command lines
        and not cmdline.read_bytes().startswith(b"sleep")
        and time.monotonic() < deadline
    ):
        time.sleep(0.001)
    try:
        (out.dir / LOCK).write_text(f"{sleeper.pid}\n")  # a bare pid, as of old
        out.lock()
        assert _lock_pid(out.dir) == os.getpid()
        out.unlock()
    finally:
        sleeper.kill()
        sleeper.wait()
    with _live_run(tmp_path / "other") as other:
        record = json.loads((tmp_path / "other" / LOCK).read_text())
        for stale in (
            json.dumps({**record, "start": record["start"] - 1}),  # another start
            f"{other.pid}\n",  # a bare pid, written before the process started:
        ):
            (out.dir / LOCK).write_text(stale)
            hour_ago = time.time() - 3600
            os.utime(out.dir / LOCK, (hour_ago, hour_ago))
            out.lock()
            assert _lock_pid(out.dir) == os.getpid()
            out.unlock()


def test_a_new_run_removes_the_previous_run_manifest_first(tmp_path):
    out = Output(tmp_path / "run")
    for name in ("old.png", "old.npz", "notes.txt", "checkpoint.npz", ".old.tmp-x.png"):
        (out.dir / name).write_text("x")
    (out.dir / "manifest.json").write_text(
        json.dumps(
            {
                "written_by": "meanfield",
                "files": ["old.png", "old.npz", "checkpoint.npz"],
            }
        )
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
    with _live_run(busy):
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


def test_a_manifest_meanfield_did_not_write_is_refused_and_nothing_deleted(
    tmp_path, capsys
):
    from meanfield._app.cli import main

    out = tmp_path / "run"
    out.mkdir()
    (out / "notes.txt").write_text("the user's notes")
    foreign = json.dumps({"files": ["notes.txt"]})
    (out / "manifest.json").write_text(foreign)
    with pytest.raises(UnusableDirectory, match="was not written by meanfield"):
        Output(out).clear_previous()
    # On the command line: one line naming the file and what to do; exit 2.
    assert main(["density", "--out", str(out), "--no-progress"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    manifest = str(out / "manifest.json")
    assert len(err) == 1 and err[0].startswith("meanfield density: error:")
    assert f"{manifest!r} was not written by meanfield" in err[0]
    assert "move it away or use another --out" in err[0]
    assert (out / "notes.txt").read_text() == "the user's notes"
    assert (out / "manifest.json").read_text() == foreign
    assert sorted(p.name for p in out.iterdir()) == ["manifest.json", "notes.txt"]


def test_a_meanfield_manifest_removes_only_plain_files_inside_the_directory(tmp_path):
    out = Output(tmp_path / "run")
    outside = tmp_path / "outside.txt"
    outside.write_text("x")
    (out.dir / "old.png").write_text("x")
    (out.dir / "sub").mkdir()
    (out.dir / "sub" / "deep.txt").write_text("x")
    (out.dir / "link").symlink_to(outside)
    listed = [
        "old.png",
        "../outside.txt",
        str(outside),
        "link",
        "sub",
        "sub/deep.txt",
        ".",
        "..",
        "",
        7,
    ]
    (out.dir / "manifest.json").write_text(
        json.dumps({"written_by": "meanfield", "files": listed})
    )
    out.clear_previous()
    assert outside.exists() and (out.dir / "sub" / "deep.txt").exists()
    assert sorted(p.name for p in out.dir.iterdir()) == ["link", "sub"]


def test_an_empty_out_is_refused_not_the_current_directory(
    tmp_path, monkeypatch, capsys
):
    from meanfield._app.cli import main

    monkeypatch.chdir(tmp_path)
    assert main(["phase", "--out", "", "--no-progress"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("meanfield phase: error:")
    assert "(--out) must not be empty" in err[0]
    assert list(tmp_path.iterdir()) == []


# Ctrl-C where Python drops the KeyboardInterrupt: in a garbage-collection
# callback (JAX registers one) while the figures are drawn, or in an exit handler
# (JAX frees its backend there) after the run. Python prints "Exception ignored"
# and goes on. `meanfield density`'s pieces are replaced by trivial ones; Python's
# own SIGINT handler is restored (the test runner may ignore SIGINT).
_SWALLOWED = """
import atexit, dataclasses, gc, signal, sys
signal.signal(signal.SIGINT, signal.default_int_handler)
from matplotlib.figure import Figure
from meanfield._app import cli, density_report
from meanfield._app.report import Result

WHEN = sys.argv[2]

def ctrl_c(*args):
    gc.callbacks.remove(ctrl_c) if ctrl_c in gc.callbacks else None
    signal.raise_signal(signal.SIGINT)

def figures(config, result, output):
    output.figure(Figure(), "first.png")
    if WHEN == "figures":
        gc.callbacks.append(ctrl_c)
        gc.collect()
    else:
        atexit.register(ctrl_c)
    output.figure(Figure(), "second.png")

density_report.REPORT = dataclasses.replace(
    density_report.REPORT,
    resolve=lambda raw: {},
    compute=lambda config, output, seed=None: Result({}, {}),
    figures=figures,
    summarize=lambda summary: "done",
)
sys.argv = ["meanfield", "density", "--out", sys.argv[1], "--no-progress"]
cli.entry()
"""


@pytest.mark.parametrize("when", ["figures", "exit"])
def test_ctrl_c_that_python_swallows_still_exits_130(tmp_path, when):
    out = tmp_path / "run"
    proc = subprocess.run(
        [sys.executable, "-c", _SWALLOWED, str(out), when],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 130, proc.stderr
    assert proc.stderr.strip().endswith("meanfield: interrupted")
    files = sorted(p.name for p in out.iterdir())
    if when == "figures":
        assert "KeyboardInterrupt" in proc.stderr  # the callback did swallow it
        # Stopped at the next file: no second figure, no manifest, no lock.
        assert files == ["first.png"] and "done" not in proc.stdout
    else:  # the run had finished; its exit handlers ran to their end, quietly
        assert proc.stderr.strip() == "meanfield: interrupted"
        assert files == ["first.png", "manifest.json", "second.png"]
        assert "done" in proc.stdout


# ---- two runs taking one lock at once, interleaved deterministically -----------------
#
# The second run is this process under another identity: `os.getpid` answers the
# pid of a live Python process (so each run sees the other as a live meanfield
# run), and it runs inside a hook on the first run's file operations: at the
# moment the lock file appears, or just before the first run creates or removes
# it. Whatever the moment, exactly one of the two holds the lock.


@contextlib.contextmanager
def _another_python():
    """A live Python process whose pid the second run claims."""
    proc = subprocess.Popen(
        [sys.executable, "-c", "import sys; sys.stdin.read()"], stdin=subprocess.PIPE
    )
    try:
        yield proc.pid
    finally:
        proc.kill()
        proc.wait()
        proc.stdin.close()


def _interleave(monkeypatch, directory, pid, *, when):
    """Run the second acquirer once, at `when` of the first's operations on the lock.

    when: "appeared" (right after a call that creates the lock file: the old
    `O_EXCL` open, or the link) or "before_create" / "before_remove" (right before
    a call that creates or removes it). Returns the list that receives the second
    run's outcome: its token, or the DirectoryInUse it raised.
    """
    from meanfield._app import lock

    path = directory / LOCK
    outcome = []
    real = {name: getattr(os, name) for name in ("open", "link", "replace", "unlink")}

    def second():
        if outcome:
            return  # once; its own calls pass through
        outcome.append(None)
        with monkeypatch.context() as m:
            m.setattr(os, "getpid", lambda: pid)
            try:
                outcome[0] = lock.acquire(directory)
            except DirectoryInUse as err:
                outcome[0] = err

    def around(name, target, creates):
        def call(*args, **kwargs):
            hit = os.fspath(args[target]) == os.fspath(path)
            if name == "open":
                hit = hit and bool(args[1] & os.O_CREAT)
            if hit and when == ("before_create" if creates else "before_remove"):
                second()
            result = real[name](*args, **kwargs)
            if hit and creates and when == "appeared":
                second()
            return result

        return call

    monkeypatch.setattr(os, "open", around("open", 0, creates=True))
    monkeypatch.setattr(os, "link", around("link", 1, creates=True))
    monkeypatch.setattr(os, "replace", around("replace", 0, creates=False))
    monkeypatch.setattr(os, "unlink", around("unlink", 0, creates=False))
    return outcome


def _holder_token(directory):
    return json.loads((directory / LOCK).read_text())["token"]


def test_a_run_arriving_as_the_lock_appears_reads_its_record_and_is_refused(
    tmp_path, monkeypatch
):
    # The lock used to appear empty (created, then written): a run arriving in
    # between took it for a garbled, stale lock and both runs went on.
    from meanfield._app.lock import acquire

    with _another_python() as pid:
        outcome = _interleave(monkeypatch, tmp_path, pid, when="appeared")
        token = acquire(tmp_path)
        assert len(outcome) == 1, "the second run never arrived"
        assert isinstance(outcome[0], DirectoryInUse), outcome
        assert f"pid {os.getpid()}" in str(outcome[0])
    assert _holder_token(tmp_path) == token
    assert sorted(p.name for p in tmp_path.iterdir()) == [LOCK]  # no temporary left


def test_a_run_arriving_just_before_the_lock_is_created_wins_it(tmp_path, monkeypatch):
    from meanfield._app.lock import acquire

    with _another_python() as pid:
        outcome = _interleave(monkeypatch, tmp_path, pid, when="before_create")
        with pytest.raises(DirectoryInUse, match=rf"pid {pid}\)"):
            acquire(tmp_path)
        assert isinstance(outcome[0], str)  # the second run's token
    assert _holder_token(tmp_path) == outcome[0]
    assert sorted(p.name for p in tmp_path.iterdir()) == [LOCK]


def test_two_runs_taking_over_one_stale_lock_do_not_both_hold_it(tmp_path, monkeypatch):
    # Both judge the lock of a dead run stale; the second takes it over first.
    # The first must not then remove the second's new lock as if it were the
    # stale one.
    from meanfield._app.lock import acquire

    dead = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"],
        capture_output=True,
        text=True,
        check=True,
    )
    stale = {"pid": int(dead.stdout), "start": 1, "host": socket.gethostname()}
    (tmp_path / LOCK).write_text(json.dumps({**stale, "token": "dead"}) + "\n")
    with _another_python() as pid:
        outcome = _interleave(monkeypatch, tmp_path, pid, when="before_remove")
        with pytest.raises(DirectoryInUse, match=rf"pid {pid}\)"):
            acquire(tmp_path)
        assert isinstance(outcome[0], str)
    assert _holder_token(tmp_path) == outcome[0]
    assert sorted(p.name for p in tmp_path.iterdir()) == [LOCK]


def test_manifests_record_no_machine_path(tmp_path, monkeypatch):
    from meanfield._app.manifest import manifest

    monkeypatch.chdir(tmp_path)
    config = {"out": str(tmp_path / "res"), "peer": "/opt/peer/code", "n": 3,
              "runs": [str(tmp_path)]}  # fmt: skip
    got = manifest(config, 0, None)["config"]
    assert got == {"out": "res", "peer": "<elsewhere>/code", "n": 3, "runs": ["."]}


def test_committed_benchmark_results_name_no_absolute_path():
    from pathlib import Path

    def strings(value):
        if isinstance(value, dict):
            for v in value.values():
                yield from strings(v)
        elif isinstance(value, list):
            for v in value:
                yield from strings(v)
        elif isinstance(value, str):
            yield value

    results = Path(__file__).parents[1] / "benchmarks" / "results"
    found = {
        path.name: s
        for path in results.glob("*.json")
        for s in strings(json.loads(path.read_text()))
        # An absolute POSIX path (of two parts or more), or a Windows drive path.
        if (s.startswith("/") and "/" in s[1:]) or s[1:3] == ":\\"
    }
    assert found == {}
