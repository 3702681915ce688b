"""Ctrl-C that always stops a run, even where a callback swallows it.

Python raises KeyboardInterrupt wherever the main thread is when it handles the
signal. Inside a garbage-collection callback (JAX registers one) or a `__del__`
the exception is printed as "Exception ignored" and dropped: a run interrupted
while drawing its figures went on to write them and exit 0. The `meanfield`
executable therefore records the interrupt (`catch`, from `cli.entry`) before
raising it; `report.Output` raises it again at its next step (a file, a progress
line, `stop_if_interrupted`) and `cli.entry` exits 130 if a run still finished
(an interrupt in the exit handlers after the run included: `deferred`).
Imports nothing heavy: `meanfield --help` stays fast.
"""

import contextlib
import signal
import threading

_SEEN = threading.Event()


def _on_interrupt(signum, frame) -> None:
    _SEEN.set()
    raise KeyboardInterrupt


def catch() -> None:
    """Record every Ctrl-C from now on (call from the main thread).

    Python's own handler is replaced only where it is in place: a SIGINT that the
    caller ignores (`nohup`, a background job) stays ignored.
    """
    if signal.getsignal(signal.SIGINT) is signal.default_int_handler:
        signal.signal(signal.SIGINT, _on_interrupt)


def _record(signum, frame) -> None:
    _SEEN.set()


@contextlib.contextmanager
def deferred():
    """Within the block, Ctrl-C is recorded (`seen`) but raises nothing.

    For the exit handlers after a run (JAX frees its backend there): they finish,
    and the exit status says that the run was interrupted.
    """
    if signal.getsignal(signal.SIGINT) is not _on_interrupt:  # not `catch`ing
        yield
        return
    signal.signal(signal.SIGINT, _record)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, _on_interrupt)


def seen() -> bool:
    """Whether Ctrl-C was pressed since `catch`."""
    return _SEEN.is_set()


def stop_if_interrupted() -> None:
    """Raise KeyboardInterrupt again if Ctrl-C was pressed (and maybe swallowed)."""
    if _SEEN.is_set():
        raise KeyboardInterrupt
