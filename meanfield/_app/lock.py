"""The lock of an output directory: one run at a time, and no lock held for good.

A run creates `.meanfield.lock` in its directory with a JSON record: its process
id, the process's start time (Linux: field 22 of `/proc/<pid>/stat`, clock ticks
since boot), the host name and a random token. The record is written to a
temporary file first and hard-linked into place (`os.link` fails where the lock
exists: one run wins), so the lock never exists without its record: a run that
arrives at any moment reads a whole record, never an empty file that it would
take for stale. (On a file system without hard links, the lock is created with
`O_EXCL` and written after.) Another run finds the lock stale, and takes it over,
when the record's process cannot be the run that wrote it:

- it no longer runs;
- its pid now belongs to a process that started at another time (the pid was
  reused after the run was killed), or, for a record without a start time (a
  bare pid, as older versions wrote), to a process that started after the lock
  was written;
- its command line (`/proc/<pid>/cmdline`) names neither Python nor meanfield.

A lock whose process cannot be checked (another host sharing the directory, a
system without `/proc` where the pid is alive) holds; the error says which file to
delete if no run is using the directory. A stale lock is moved aside before it is
removed, and put back if it is not the file that was judged stale (another run
took the lock over first). The token is the holder's: `release` removes only the
lock that this `acquire` took.
"""

import contextlib
import errno
import json
import os
import secrets
import socket
from pathlib import Path

#: The lock file of a directory a run is writing into.
LOCK = ".meanfield.lock"


class UnusableDirectory(ValueError):
    """The output directory cannot take this run (one-line message, exit 2)."""


class DirectoryInUse(UnusableDirectory):
    """Another live run holds the output directory's lock."""


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # exists, owned by someone else
        return True
    return True


def _proc(name: str) -> bytes | None:
    """`/proc/<name>`, or None where there is no such file (not Linux)."""
    try:
        return Path("/proc", name).read_bytes()
    except OSError:
        return None


def start_ticks(pid: int) -> int | None:
    """When process `pid` started (clock ticks since boot), None if unknown."""
    stat = _proc(f"{pid}/stat")
    if stat is None:
        return None
    # Fields after the command name, which is in parentheses and may hold spaces:
    # state is field 3, so the start time (field 22) is the 20th of these.
    fields = stat[stat.rfind(b")") + 2 :].split()
    try:
        return int(fields[19])
    except (IndexError, ValueError):
        return None


def _started_after(pid: int, when: float) -> bool:
    """Whether process `pid` started after `when` (seconds since the epoch)."""
    ticks = start_ticks(pid)
    stat = _proc("stat") or b""  # its `btime` line: the boot time (epoch seconds)
    boot = [line for line in stat.splitlines() if line.startswith(b"btime ")]
    if ticks is None or not boot:
        return False
    # btime has whole seconds: a margin of 2 s keeps a live run's lock held.
    return int(boot[0].split()[1]) + ticks / os.sysconf("SC_CLK_TCK") > when + 2


def _not_meanfield(pid: int) -> bool:
    """Whether process `pid`'s command line names neither Python nor meanfield."""
    cmdline = _proc(f"{pid}/cmdline")
    if not cmdline:  # unknown (not Linux, or a kernel thread): cannot tell
        return False
    words = cmdline.lower().split(b"\0")
    # `python -m meanfield`, the `meanfield` script (run by python), a script
    # or a notebook kernel calling `run_phase`: all name one or the other.
    return not any(b"python" in os.path.basename(w) or b"meanfield" in w for w in words)


def _read(path: Path) -> tuple[dict, float]:
    """The lock's record ({} if unreadable) and its modification time."""
    try:
        text, mtime = path.read_text(), path.stat().st_mtime
    except OSError:
        return {}, 0.0
    try:
        record = json.loads(text)
    except ValueError:
        return {}, mtime
    if isinstance(record, int) and not isinstance(record, bool):
        return {"pid": record}, mtime  # a bare pid (older versions)
    return (record if isinstance(record, dict) else {}), mtime


def holder(path: Path) -> dict | None:
    """The live holder's record of the lock at `path`; None if free or stale."""
    record, mtime = _read(path)
    pid = record.get("pid")
    if not isinstance(pid, int) or pid <= 0 or pid == os.getpid():
        return None  # garbled, or this process's own (a run that did not end)
    if record.get("host", socket.gethostname()) != socket.gethostname():
        return record  # another machine's process: cannot be checked here
    if not _alive(pid):
        return None
    start = record.get("start")
    now = start_ticks(pid)
    if start is not None and now is not None and start != now:
        return None  # the pid was reused
    if start is None and _started_after(pid, mtime):
        return None  # started after the lock was written: the pid was reused
    if _not_meanfield(pid):
        return None
    return record


#: `os.link` errors of file systems without hard links (FAT, some network shares).
_NO_HARD_LINKS = {errno.EPERM, errno.ENOTSUP, errno.EOPNOTSUPP, errno.ENOSYS}


def _create_exclusive(path: Path, text: str) -> bool:
    """Create `path` holding `text` unless it exists (then False): `O_EXCL`."""
    try:
        fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
    except FileExistsError:
        return False
    with os.fdopen(fd, "w") as f:
        f.write(text)
    return True


def _publish(path: Path, text: str, token: str) -> bool:
    """Create `path` holding `text`, whole, unless it exists (then False).

    A temporary file (a name `Output.clear_previous` removes, should this process
    die here) is hard-linked to `path`: the lock appears with its record.
    """
    tmp = path.with_name(f".meanfield.tmp-{token}.lock")
    _create_exclusive(tmp, text)
    try:
        os.link(tmp, path)
    except FileExistsError:
        return False
    except FileNotFoundError:  # the holder's `clear_previous` took the temporary
        return False
    except OSError as err:
        if err.errno not in _NO_HARD_LINKS:
            raise
        return _create_exclusive(path, text)
    finally:
        tmp.unlink(missing_ok=True)
    return True


def _contents(path: Path) -> bytes | None:
    try:
        return path.read_bytes()
    except OSError:
        return None


def _remove_stale(path: Path, judged: bytes, token: str) -> None:
    """Remove the lock file judged stale, but not one that replaced it since.

    Two runs may judge the same stale lock: the first removes it and takes the
    lock, and the second must not remove the first's. The file at `path` is moved
    aside (atomically) and deleted only if it holds the record judged (a new
    lock's record differs: its token is new; an inode number may be reused);
    else it goes back.
    """
    aside = path.with_name(f".meanfield.tmp-{token}.stale")
    try:
        os.replace(path, aside)
    except FileNotFoundError:
        return  # another run removed it first
    if _contents(aside) != judged:
        with contextlib.suppress(FileExistsError):  # a third run took it meanwhile
            os.link(aside, path)
    aside.unlink(missing_ok=True)


def acquire(directory: Path) -> str:
    """Take the lock of `directory`; return this holder's token.

    Raises:
        DirectoryInUse: a live run holds it.
    """
    path = directory / LOCK
    token = secrets.token_hex(8)
    record = {
        "pid": os.getpid(),
        "start": start_ticks(os.getpid()),
        "host": socket.gethostname(),
        "token": token,
    }
    for _ in range(2):
        if _publish(path, json.dumps(record) + "\n", token):
            return token
        judged = _contents(path)  # what `holder` reads (or a successor's record)
        other = holder(path)
        if other is not None:
            where = other.get("host")
            on = f" on {where}" if where and where != record["host"] else ""
            raise DirectoryInUse(
                f"the output directory {str(directory)!r} is in use by another "
                f"run (pid {other['pid']}{on}); use another --out, or delete "
                f"{str(path)!r} if no meanfield run is using this directory"
            )
        if judged is not None:
            _remove_stale(path, judged, token)  # stale: its run is gone
    raise DirectoryInUse(
        f"cannot lock the output directory {str(directory)!r}: another run took "
        f"{str(path)!r} at the same time; use another --out"
    )


def release(directory: Path, token: str | None) -> None:
    """Remove the lock of `directory` if `token` took it."""
    path = directory / LOCK
    with contextlib.suppress(OSError):
        if token is not None and _read(path)[0].get("token") == token:
            path.unlink()
