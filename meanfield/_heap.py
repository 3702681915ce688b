"""Keep the top of the C heap between XLA's CPU steps (glibc's M_TOP_PAD).

XLA's CPU runtime allocates and frees temporaries at every operation. Depending
on the process's allocation history, glibc's adaptive thresholds can end up
returning that memory to the system after every step, and the next step faults
the same pages in again, zero-filled: 4096 systems of 32 tokens to t = 30 (a
chunk of `mf.clustering.phase_diagram`) took 12.5 s and 6.4 million page faults
instead of 4.9 s and 0.05 million on 2 cores. Setting M_TOP_PAD (16 MiB of
padding at the heap top) before XLA's CPU client exists fixes glibc's
thresholds at their initial values and removes the churn. Set later, after the
client's own allocations have moved the thresholds, the same call froze them in
a bad state (20 million faults for three chunks, 2.4x slower), so `keep_top`
does nothing once a JAX backend is initialised.

Settings, read once when `meanfield` is imported:
- `MEANFIELD_HEAP_TOP_PAD=0` (or "off", "false", "no"): leave malloc alone;
- `MEANFIELD_HEAP_TOP_PAD=<bytes>`: that padding;
- unset: TOP_PAD.
Other C libraries than glibc (macOS, musl) are left alone.
"""

from __future__ import annotations

import ctypes
import os
import sys

from ._compile_cache import OFF  # the same opt-out words

ENV = "MEANFIELD_HEAP_TOP_PAD"
#: Padding kept at the heap top (bytes).
TOP_PAD = 16 * 1024**2
#: glibc's mallopt parameter number of M_TOP_PAD (malloc.h).
_M_TOP_PAD = -2

_state: dict = {}


def _backend_started() -> bool:
    """Whether a JAX backend (XLA's client) exists already; JAX is not imported."""
    bridge = sys.modules.get("jax._src.xla_bridge")
    return bool(getattr(bridge, "_backends", None))


def keep_top() -> int | None:
    """Set glibc's M_TOP_PAD once per process (see the module docstring).

    Returns:
        The padding set in bytes, or None when left alone (opted out, not glibc,
        a JAX backend already running, or a value that is not a non-negative
        integer: this is an optimisation, never a reason to fail).
    """
    if "pad" in _state:
        return _state["pad"]
    _state["pad"] = None
    setting = os.environ.get(ENV, "").strip().lower()
    if setting in OFF:
        return None
    try:
        pad = int(setting) if setting else TOP_PAD
    except ValueError:
        return None
    if pad < 0 or _backend_started():
        return None
    try:
        libc = ctypes.CDLL(None)
        mallopt = libc.mallopt  # glibc only (musl and macOS have none)
        libc.gnu_get_libc_version  # noqa: B018 - glibc's M_TOP_PAD number
    except (OSError, AttributeError, TypeError):  # TypeError: Windows' CDLL(None)
        return None
    mallopt.argtypes = (ctypes.c_int, ctypes.c_int)
    if mallopt(_M_TOP_PAD, min(pad, 2**31 - 1)) == 1:
        _state["pad"] = pad
    return _state["pad"]
