"""Atomic file writes: arrays, figures, text and bytes (and reading arrays back).

Every output is written to a temporary file in the destination directory, flushed
to disk and moved into place with `os.replace`, so a reader (or a crashed run)
never sees a half-written file: it sees the old file or the new one. Used by the
library (BERT weights, animations) and by the commands (`meanfield._app`, whose run
manifests live in `meanfield._app.manifest`).
"""

import contextlib
import os
import tempfile
import zipfile
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any

import numpy as np


def _umask() -> int:
    # The only portable way to read the umask is to set it and restore it.
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


@contextlib.contextmanager
def atomic_path(path: str | os.PathLike) -> Iterator[Path]:
    """A temporary path next to `path`; on success the file there replaces `path`.

    For writers that take a file name (movie writers, Pillow, ffmpeg). The
    temporary name keeps the real suffix (`.tmp-<random>.png`, not `.png.tmp`):
    writers that infer the format from the name then do the right thing. The file
    is flushed to disk before the rename; on error it is removed and `path` is left
    untouched.
    """
    path = Path(path)
    # Same directory: os.replace is only atomic within one filesystem.
    fd, tmp = tempfile.mkstemp(
        dir=path.parent, prefix=f".{path.stem}.tmp-", suffix=path.suffix
    )
    os.close(fd)
    try:
        yield Path(tmp)
        # mkstemp creates the file 0600; give it the usual 0666 & ~umask.
        os.chmod(tmp, 0o666 & ~_umask())
        with open(tmp, "rb") as f:
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise


@contextlib.contextmanager
def _atomic_file(path: str | os.PathLike, mode: str = "wb") -> Iterator[IO]:
    """`atomic_path`, opened: write to the yielded file object."""
    with atomic_path(path) as tmp, open(tmp, mode) as f:
        yield f


def atomic_write_bytes(path: str | os.PathLike, data: bytes) -> None:
    """Write `data` to `path` atomically.

    Args:
        path: destination file; its directory must exist.
        data: the bytes to write.
    """
    with _atomic_file(path, "wb") as f:
        f.write(data)


def atomic_write_text(path: str | os.PathLike, text: str) -> None:
    """Write `text` (UTF-8) to `path` atomically.

    Args:
        path: destination file; its directory must exist.
        text: the text to write.
    """
    atomic_write_bytes(path, text.encode("utf-8"))


def save_npz_atomic(path: str | os.PathLike, **arrays: Any) -> None:
    """Save arrays to an uncompressed `.npz` archive atomically.

    Args:
        path: destination file (conventionally ending in `.npz`); its directory
            must exist.
        **arrays: name -> array (NumPy or JAX; converted with `np.asarray`).
    """
    # np.savez on an open file object writes there as is (it appends `.npz` only
    # to bare file names), so the archive lands exactly at `path`.
    with _atomic_file(path, "wb") as f:
        np.savez(f, **{k: np.asarray(v) for k, v in arrays.items()})


#: What `load_npz` (or reading a named array of its result) raises on a file
#: that is missing, truncated, corrupt or not the archive expected.
UNREADABLE_NPZ = (OSError, ValueError, KeyError, EOFError, zipfile.BadZipFile)


def load_npz(path: str | os.PathLike) -> dict[str, np.ndarray]:
    """Every array of the `.npz` archive at `path` (as `save_npz_atomic` wrote it).

    Raises:
        One of `UNREADABLE_NPZ`: the file is missing or unreadable.
    """
    # Our own handle: np.load leaks its file when the archive is corrupt.
    with open(path, "rb") as f, np.load(f) as data:
        return {name: data[name] for name in data.files}


def savefig_atomic(fig, path: str | os.PathLike, **kw: Any) -> None:
    """Save a matplotlib figure to `path` atomically.

    Args:
        fig: a `matplotlib.figure.Figure`.
        path: destination file; the format comes from its suffix unless `format`
            is given in `kw`.
        **kw: forwarded to `fig.savefig` (dpi, bbox_inches, ...).
    """
    fmt = kw.pop("format", None) or Path(path).suffix.lstrip(".") or None
    with _atomic_file(path, "wb") as f:
        fig.savefig(f, format=fmt, **kw)


def save_figure(fig, path: str | os.PathLike, **kw: Any) -> None:
    """`savefig_atomic`, then close the figure (pyplot keeps open figures alive).

    Args:
        fig: a `matplotlib.figure.Figure`.
        path: destination file.
        **kw: forwarded to `fig.savefig` (dpi, bbox_inches, ...).
    """
    import matplotlib.pyplot as plt

    try:
        savefig_atomic(fig, path, **kw)
    finally:
        plt.close(fig)
