"""Run manifests: what produced a result (configuration, seed, versions, device).

Every command writes one next to its results (`manifest.json`, or inside the
benchmark's JSON) as strict JSON, atomically (`meanfield._io`). Its `written_by`
field marks it as meanfield's: a run into a directory removes the files that the
previous manifest lists only when meanfield wrote that manifest.
"""

import datetime
import importlib.metadata
import json
import math
import os
import platform
from collections.abc import Sequence
from typing import Any

import numpy as np

from .._io import atomic_write_text

#: The value of a manifest's `written_by` field.
WRITTEN_BY = "meanfield"

_VERSIONED = (
    "meanfield",
    "jax",
    "jaxlib",
    "diffrax",
    "equinox",
    "numpy",
    "matplotlib",
)


def _version(dist: str) -> str | None:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return None


def versions(dists: Sequence[str] = _VERSIONED) -> dict[str, str | None]:
    """{distribution: its installed version, None if not installed} of `dists`."""
    return {name: _version(name) for name in dists}


def portable(value: Any, root: str | None = None) -> Any:
    """`value` with every absolute path made portable (a manifest travels).

    A string that is an absolute path inside `root` (default: the working
    directory) becomes relative to it; one outside becomes "<elsewhere>/NAME"
    (where it lay on one machine says nothing elsewhere). Dicts, lists and
    tuples are walked; other values are returned as they are.
    """
    root = os.path.realpath(root or os.getcwd())
    if isinstance(value, dict):
        return {k: portable(v, root) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [portable(v, root) for v in value]
    if isinstance(value, str) and os.path.isabs(value):
        path = os.path.realpath(value)
        if path == root or path.startswith(root + os.sep):
            return os.path.relpath(path, root)
        return f"<elsewhere>/{os.path.basename(path.rstrip(os.sep))}"
    return value


def manifest(config: dict, seed: int | None, wall_time: float | None) -> dict[str, Any]:
    """Describe a run: configuration, seed, timing, software versions and device.

    Args:
        config: the run's parameters (JSON-serialisable); absolute paths in it
            are recorded relative to the working directory (`portable`).
        seed: the PRNG seed, or None for a deterministic run.
        wall_time: elapsed wall-clock seconds, or None if not measured.

    Returns:
        A dict with keys "written_by" ("meanfield"), "config", "seed",
        "wall_time_s", "versions" (meanfield, jax, jaxlib, diffrax, equinox, numpy,
        matplotlib, python), "device" ({"name", "platform"}) and "created"
        (ISO 8601, UTC).
    """
    # Imported here: only the device query needs JAX, and importing this module
    # should not initialise a backend (`meanfield --help` imports no JAX).
    import jax

    installed = versions()
    installed["python"] = platform.python_version()
    device = jax.devices()[0]
    return {
        "written_by": WRITTEN_BY,
        "config": portable(config),
        "seed": seed,
        "wall_time_s": wall_time,
        "versions": installed,
        "device": {"name": str(device), "platform": device.platform},
        "created": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
    }


def written_by_meanfield(manifest_dict: Any) -> bool:
    """Whether a parsed `manifest.json` is meanfield's (its `written_by` field)."""
    return (
        isinstance(manifest_dict, dict)
        and manifest_dict.get("written_by") == WRITTEN_BY
        and isinstance(manifest_dict.get("files", []), list)
    )


def jsonable(obj: Any) -> Any:
    """Convert NumPy/JAX values, paths and non-finite floats for strict JSON.

    Non-finite floats become the strings "inf", "-inf" and "nan": bare
    `Infinity`/`NaN` tokens are not JSON and break strict readers (jq, browsers).
    """
    if isinstance(obj, dict):
        return {str(k): jsonable(v) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return [jsonable(v) for v in obj]
    if isinstance(obj, os.PathLike):
        return os.fspath(obj)
    if obj is None or isinstance(obj, bool | int | str):
        return obj
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else str(obj)
    arr = np.asarray(obj)  # NumPy/JAX scalars and arrays
    if arr.dtype == object:
        return repr(obj)
    return jsonable(arr.tolist())


def write_manifest(path: str | os.PathLike, manifest_dict: dict) -> None:
    """Write a manifest as pretty-printed strict JSON, atomically.

    NumPy/JAX arrays become (nested) lists; non-finite floats become the strings
    "inf", "-inf", "nan".

    Args:
        path: destination file; its directory must exist.
        manifest_dict: typically the output of `manifest`, possibly extended.
    """
    text = json.dumps(jsonable(manifest_dict), indent=2, allow_nan=False)
    atomic_write_text(path, text + "\n")
