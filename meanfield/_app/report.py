"""The skeleton every report shares: configuration -> run -> files -> summary.

A report (`meanfield gaussian`, `lipschitz`, `simulate`, the tour's clustering) is
a `Report` made of four functions; the skeleton does everything around them:

    resolve(raw) -> config                  validate the TOML (`config.resolve`)
    compute(config, output, *, seed, ...)   the numbers -> `Result` (summary,
                                            arrays, the manifest's configuration)
    figures(config, result, output)         draw: `output.figure(fig, "x.png")`
    summarize(summary) -> str               the lines printed at the end

`Report.run` creates the output directory, computes, saves the arrays, draws the
figures and writes `manifest.json` (configuration, seed, versions, device, wall
time, summary); `Report.main` is the command line around it (TOML file, one-line
errors with exit status 2, the printed summary). Progress lines go to stderr
through `Output.log`, silenced by `--no-progress`; every file is written
atomically (`meanfield._io`). A Ctrl-C that a callback swallowed is raised again
at `Output`'s next step (`meanfield._app.interrupts`). Imports neither JAX nor
matplotlib.
"""

import argparse
import contextlib
import dataclasses
import json
import os
import stat
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from .. import _io
from .config import load_toml
from .interrupts import stop_if_interrupted
from .lock import LOCK, DirectoryInUse, UnusableDirectory, acquire, release  # noqa: F401
from .manifest import manifest, write_manifest, written_by_meanfield

#: The manifest of a finished run; it lists the files the run wrote.
MANIFEST = "manifest.json"


class Output:
    """Where a run writes: its directory, its progress log and its clock.

    Args:
        out_dir: the output directory, created (with its parents) if needed.
        progress: print `log` messages to stderr.

    Raises:
        ValueError: the directory is empty (`''`: not the current directory by
            accident), cannot be created or written (one line).
    """

    def __init__(self, out_dir: str | os.PathLike, *, progress: bool = False):
        if not os.fspath(out_dir):
            raise ValueError(
                "the output directory (--out) must not be empty; got ''; "
                "write --out . for the current directory"
            )
        self.dir = Path(out_dir)
        try:
            self.dir.mkdir(parents=True, exist_ok=True)
        except OSError as err:
            raise ValueError(
                f"cannot create the output directory {str(self.dir)!r}: "
                f"{err.strerror or err}"
            ) from err
        if not os.access(self.dir, os.W_OK | os.X_OK):
            raise ValueError(f"the output directory {str(self.dir)!r} is not writable")
        self.progress = progress
        self.written: list[str] = []
        self._start = time.perf_counter()
        self._token: str | None = None

    def lock(self) -> None:
        """Take the directory for this run: two runs never mix their outputs.

        A lock left by a run that no longer exists (killed, its pid maybe reused
        by another program) is taken over (`meanfield._app.lock`).

        Raises:
            DirectoryInUse: a live run holds it; the message names the lock file
                to delete if no run is using the directory.
        """
        self._token = acquire(self.dir)

    def unlock(self) -> None:
        """Release `lock` (if this `Output` holds it)."""
        release(self.dir, self._token)
        self._token = None

    @contextlib.contextmanager
    def locked(self):
        """`lock` for the duration of a `with` block, released however it ends."""
        self.lock()
        try:
            yield self
        finally:
            self.unlock()

    def clear_previous(self, keep: tuple[str, ...] = ()) -> None:
        """Remove a previous run's outputs, its manifest first.

        A run killed after this leaves only its own files and no manifest, never
        a manifest beside another run's arrays. The files are those the old
        manifest lists (`files`), so unrelated files in the directory stay; and
        only a manifest that meanfield wrote is read: a `manifest.json` of the
        user's is neither replaced nor obeyed. Of its list, only plain files
        directly in the directory go (no paths, links or directories).

        Args:
            keep: file names to leave (a checkpoint to resume from).

        Raises:
            UnusableDirectory: `manifest.json` exists and meanfield did not write
                it.
        """
        path = self.dir / MANIFEST
        if path.exists() or path.is_symlink():
            try:
                old = None if path.is_symlink() else json.loads(path.read_text())
            except (OSError, ValueError):  # unreadable, or not JSON
                old = None
            if not written_by_meanfield(old):
                raise UnusableDirectory(
                    f"{str(path)!r} was not written by meanfield, and a run would "
                    "replace it; move it away or use another --out"
                )
            path.unlink()
            for name in old.get("files", []):
                if _plain_file(self.dir, name) and name not in keep:
                    (self.dir / name).unlink(missing_ok=True)
        # Temporary files of a writer that was killed (`_io.atomic_path`).
        for tmp in self.dir.glob(".*.tmp-*"):
            tmp.unlink(missing_ok=True)

    @property
    def wall_s(self) -> float:
        """Seconds since the output was opened."""
        return time.perf_counter() - self._start

    def log(self, message: str) -> None:
        """One progress line on stderr, when progress is on."""
        stop_if_interrupted()
        if self.progress:
            print(message, file=sys.stderr, flush=True)

    def note(self, message: str) -> None:
        """One line on stderr whatever `progress` says: what the user must know."""
        stop_if_interrupted()
        print(message, file=sys.stderr, flush=True)

    def path(self, name: str) -> Path:
        """The path of `name` for a writer that takes a file name (an animation).

        The name is recorded as written, so the manifest lists it and the next run
        into this directory removes it (`clear_previous`).
        """
        stop_if_interrupted()  # a Ctrl-C that a callback swallowed
        if name not in self.written:
            self.written.append(name)
        return self.dir / name

    def figure(self, fig, name: str, *, dpi: int = 150, **kw: Any) -> Path:
        """Save a matplotlib figure atomically as `name` and close it.

        Args:
            fig: a `matplotlib.figure.Figure`.
            name: file name in the output directory (its suffix is the format).
            dpi: resolution.
            **kw: forwarded to `fig.savefig` (bbox_inches, ...).

        Returns:
            The path written.
        """
        path = self.path(name)
        _io.save_figure(fig, path, dpi=dpi, **kw)
        return path

    def arrays(self, name: str, **arrays: Any) -> Path:
        """Save arrays atomically as the uncompressed archive `name` (`.npz`)."""
        path = self.path(name)
        _io.save_npz_atomic(path, **arrays)
        return path

    def json(self, name: str, data: dict) -> Path:
        """Write `data` atomically as strict JSON (arrays as lists, inf as "inf")."""
        path = self.path(name)
        write_manifest(path, data)
        return path

    def describe(self, config: dict, seed: int | None) -> dict[str, Any]:
        """The run's manifest so far: configuration, seed, wall time, versions."""
        return manifest(config, seed, self.wall_s)

    def manifest(
        self,
        config: dict,
        seed: int | None,
        summary: dict | None = None,
        *,
        name: str = MANIFEST,
    ) -> dict[str, Any]:
        """Write the manifest (`describe`, the summary, the files written) as `name`.

        Returns:
            The manifest written.
        """
        man = self.describe(config, seed)
        if summary is not None:
            man["summary"] = summary
        man["files"] = [f for f in self.written if f != name]
        self.json(name, man)
        return man


@dataclasses.dataclass
class Result:
    """What a report's `compute` hands to the skeleton.

    Attributes:
        summary: printed by `summarize`, stored in the manifest and returned.
        config: the manifest's configuration: the resolved one plus what the run
            derived (dtype, solver settings, paths).
        arrays: name -> array, saved in the report's `.npz` archive.
        data: what `figures` needs beyond the arrays (solutions, studies).
    """

    summary: dict
    config: dict
    arrays: dict = dataclasses.field(default_factory=dict)
    data: Any = None


@dataclasses.dataclass(frozen=True)
class Report:
    """One report: its pieces, and the run and the command line around them.

    Attributes:
        name: the command's name, in error messages (`meanfield <name>: error:`).
        resolve: raw configuration (parsed TOML, or None) -> full configuration;
            ValueError naming the key.
        compute: `(config, output, *, seed, **options) -> Result`.
        figures: `(config, result, output) -> None`, saving with `output.figure`.
        summarize: summary -> the lines printed after the run.
        arrays: file name of the arrays (`.npz`).
        check: `(config, args) -> None`, further validation on the command line
            (installed extras, a checkpoint to resume); ValueError.
        wall_in_summary: also record the wall time as the summary's `wall_time_s`.
        keep: files of a previous run that a new one must not remove
            (simulate's checkpoint).
    """

    name: str
    resolve: Callable[[dict | None], dict]
    compute: Callable[..., Result]
    figures: Callable[[dict, Result, Output], None]
    summarize: Callable[[dict], str]
    arrays: str
    check: Callable[[dict, argparse.Namespace], None] | None = None
    wall_in_summary: bool = False
    keep: tuple[str, ...] = ()

    def run(
        self,
        config: dict,
        out_dir: str | os.PathLike,
        *,
        seed: int | None = None,
        progress: bool = False,
        **options: Any,
    ) -> dict:
        """Compute, save arrays and figures, write the manifest.

        Args:
            config: a resolved configuration (`resolve`).
            out_dir: output directory, created if needed.
            seed: the run's PRNG seed (recorded in the manifest).
            progress: progress lines and bars on stderr.
            **options: forwarded to `compute` (e.g. simulate's `resume`).

        Returns:
            The summary.
        """
        output = Output(out_dir, progress=progress)
        with output.locked():
            # The previous run's files go before any of this run's is written;
            # the checkpoint stays (a resumed run reads it, a fresh one replaces it).
            output.clear_previous(keep=self.keep)
            result = self.compute(config, output, seed=seed, **options)
            if result.arrays:
                output.arrays(self.arrays, **result.arrays)
            output.log("drawing figures")
            self.figures(config, result, output)
            if self.wall_in_summary:
                result.summary["wall_time_s"] = output.wall_s
            output.manifest(result.config, seed, result.summary)
        return result.summary

    def main(self, args: argparse.Namespace, **options: Any) -> int:
        """The command: `--config` -> configuration -> run -> printed summary.

        Configuration errors are the user's: one line on stderr, exit status 2 (as
        argparse does for bad options), no traceback, nothing written. Errors past
        this point are bugs and keep their traceback.

        Args:
            args: parsed options: `config` (a TOML path or None), `out`, `seed`,
                `progress`, and what `check` reads.
            **options: forwarded to `run`.

        Returns:
            The exit status: 0, or 2 for a configuration error.
        """
        try:
            raw = load_toml(args.config) if args.config is not None else {}
            config = self.resolve(raw)
            if self.check is not None:
                self.check(config, args)
            Output(args.out)  # creatable and writable, before the run
        except ValueError as err:
            return fail(self.name, err)
        use_agg()
        start = time.perf_counter()
        try:
            summary = self.run(
                config, args.out, seed=args.seed, progress=args.progress, **options
            )
        except UnusableDirectory as err:  # in use, or a manifest not meanfield's
            return fail(self.name, err)
        except OSError as err:  # full disk, directory removed mid-run
            return fail(self.name, f"cannot write to {args.out!r}: {err}")
        print(self.summarize(summary))
        print(f"wrote {args.out}/ in {time.perf_counter() - start:.1f} s")
        return 0


def _plain_file(directory: Path, name) -> bool:
    """Whether `name` is a regular file directly in `directory` (not a link)."""
    if not isinstance(name, str) or name in ("", ".", "..") or "\0" in name:
        return False
    if "/" in name or "\\" in name or os.path.isabs(name):
        return False
    try:
        return stat.S_ISREG((directory / name).lstat().st_mode)
    except OSError:
        return False


def fail(command: str, err: Exception | str) -> int:
    """Print `meanfield <command>: error: <message>` on one line; return 2."""
    message = " ".join(str(err).split())
    print(f"meanfield {command}: error: {message}", file=sys.stderr)
    return 2


def use_agg() -> None:
    """Files only, never windows: select matplotlib's Agg backend.

    Unless pyplot is already in use (a command called from a notebook or a script
    that chose its backend).
    """
    if "matplotlib.pyplot" not in sys.modules:
        import matplotlib

        matplotlib.use("Agg")


def format_matrix(matrix) -> str:
    """Compact matrix text for titles and summaries: [[1, 0.5], [0, 1]]."""
    rows = np.atleast_2d(np.asarray(matrix, float))
    return (
        "["
        + ", ".join("[" + ", ".join(f"{v:.3g}" for v in row) + "]" for row in rows)
        + "]"
    )
