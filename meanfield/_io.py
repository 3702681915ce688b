"""Atomic file writes and run manifests for results written by the CLI and demos.

Every output is written to a temporary file in the destination directory, flushed
to disk and moved into place with `os.replace`, so a reader (or a crashed run)
never sees a half-written file: it sees the old file or the new one.
"""

import contextlib
import datetime
import importlib.metadata
import json
import math
import os
import platform
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any

import numpy as np

_VERSIONED = (
    "meanfield",
    "jax",
    "jaxlib",
    "diffrax",
    "equinox",
    "numpy",
    "matplotlib",
)


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


def _version(dist: str) -> str | None:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return None


def manifest(config: dict, seed: int | None, wall_time: float | None) -> dict[str, Any]:
    """Describe a run: configuration, seed, timing, software versions and device.

    Args:
        config: the run's parameters (JSON-serialisable).
        seed: the PRNG seed, or None for a deterministic run.
        wall_time: elapsed wall-clock seconds, or None if not measured.

    Returns:
        A dict with keys "config", "seed", "wall_time_s", "versions" (meanfield,
        jax, jaxlib, diffrax, equinox, numpy, matplotlib, python), "device"
        ({"name", "platform"}) and "created" (ISO 8601, UTC).
    """
    # Imported here: only the device query needs JAX, and importing this module
    # should not initialise a backend.
    import jax

    versions = {name: _version(name) for name in _VERSIONED}
    versions["python"] = platform.python_version()
    device = jax.devices()[0]
    return {
        "config": config,
        "seed": seed,
        "wall_time_s": wall_time,
        "versions": versions,
        "device": {"name": str(device), "platform": device.platform},
        "created": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
    }


def _jsonable(obj: Any) -> Any:
    """Convert NumPy/JAX values, paths and non-finite floats for strict JSON.

    Non-finite floats become the strings "inf", "-inf" and "nan": bare
    `Infinity`/`NaN` tokens are not JSON and break strict readers (jq, browsers).
    """
    if isinstance(obj, dict):
        return {str(k): _jsonable(v) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return [_jsonable(v) for v in obj]
    if isinstance(obj, os.PathLike):
        return os.fspath(obj)
    if obj is None or isinstance(obj, bool | int | str):
        return obj
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else str(obj)
    arr = np.asarray(obj)  # NumPy/JAX scalars and arrays
    if arr.dtype == object:
        return repr(obj)
    return _jsonable(arr.tolist())


def write_manifest(path: str | os.PathLike, manifest_dict: dict) -> None:
    """Write a manifest as pretty-printed strict JSON, atomically.

    NumPy/JAX arrays become (nested) lists; non-finite floats become the strings
    "inf", "-inf", "nan".

    Args:
        path: destination file; its directory must exist.
        manifest_dict: typically the output of `manifest`, possibly extended.
    """
    text = json.dumps(_jsonable(manifest_dict), indent=2, allow_nan=False)
    atomic_write_text(path, text + "\n")
