"""JAX's persistent compilation cache, on by default in a user cache directory.

A solve compiles once per structure and process; the cache keeps the compiled
executables on disk, so a fresh process (a script run again, a CLI command, a
notebook restart) loads them instead of compiling again. JAX's keys include its
version, the backend, the XLA flags and the program, so a stale entry is never
used.

Settings, read once when the engine is first used:
- `MEANFIELD_COMPILATION_CACHE=0` (or "off", "false", "no"): leave JAX's cache
  alone (off unless the caller configured it);
- `MEANFIELD_COMPILATION_CACHE=/some/dir`: use that directory;
- unset: `$XDG_CACHE_HOME/meanfield/jax` (default `~/.cache/meanfield/jax`).
In meanfield's directory the cache holds at most MAX_BYTES (2 GiB; least recently
used programs are evicted).
A directory the caller already gave JAX (`jax_compilation_cache_dir`) always wins.
"""

from __future__ import annotations

import os
from pathlib import Path

ENV = "MEANFIELD_COMPILATION_CACHE"
OFF = ("0", "off", "false", "no")
#: Cache programs whose compilation took at least this long. JAX's default (1 s)
#: would skip most of a study's programs, which compile in 0.1-1 s each.
MIN_COMPILE_SECONDS = 0.1
#: Disk budget of meanfield's cache directory: JAX evicts the least recently used
#: programs beyond it (its own default is unbounded).
MAX_BYTES = 2 * 1024**3

_state: dict = {}


def default_dir() -> Path:
    """`$XDG_CACHE_HOME/meanfield/jax`, `~/.cache/meanfield/jax` without it."""
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "meanfield" / "jax"


def enable() -> Path | None:
    """Point JAX's persistent cache at meanfield's directory (once per process).

    Returns:
        The cache directory in use, or None when the cache is off (opted out, or
        the directory cannot be created or written: the cache is an optimisation,
        never a reason to fail).
    """
    if "dir" in _state:
        return _state["dir"]
    import jax

    setting = os.environ.get(ENV, "").strip()
    given = jax.config.jax_compilation_cache_dir
    if given:
        path = Path(given)
    elif setting.lower() in OFF:
        path = None
    else:
        path = Path(setting).expanduser() if setting else default_dir()
        try:
            path.mkdir(parents=True, exist_ok=True)
            writable = os.access(path, os.W_OK | os.X_OK)
        except OSError:
            writable = False
        if writable:
            jax.config.update("jax_compilation_cache_dir", str(path))
            jax.config.update(
                "jax_persistent_cache_min_compile_time_secs", MIN_COMPILE_SECONDS
            )
            jax.config.update("jax_compilation_cache_max_size", MAX_BYTES)
        else:
            path = None
    _state["dir"] = path
    return path
