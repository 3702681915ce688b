"""The solver clock: s in [0, L], t = t0 + s (t1 - t0) / L, L a power of two.

dt/ds = (t1 - t0) / L is within a factor sqrt(2) of 1, so the field, the step
sizes and their floors keep the magnitudes they have in t (a unit interval would
multiply the field by t1 - t0 and overflow it for long horizons), and s resolves
t - t0 to its own ulps: nothing is lost against integrating in t. Step and
blow-up rules are evaluated in t (`to_t`).

Every number of the clock is a traced argument of the compiled solve: t0, t1,
L and the save fractions (t_k - t0) / (t1 - t0). A sweep over t1 or over the
values of the save times reuses one compiled program per shape.

JAX never writes a program holding a host callback to its persistent
compilation cache, and diffrax checks its save times (non-decreasing, inside
[t0, t1]) with `eqx.error_if`, whose runtime check is a host callback. Concrete
save times are checked here on the host (`save_fractions`); diffrax's repeat of
the check is then compiled without its callback (`checked_on_host`). Save times
traced by a caller's jit or vmap keep diffrax's runtime check.
"""

from __future__ import annotations

import contextlib
import math
import threading

import diffrax as dfx
import numpy as np
from jaxtyping import Array, ArrayLike, Float

from ._checks import is_traced


def save_fractions(
    saveat: ArrayLike | None, t0: float, t1: float
) -> tuple[np.ndarray | Array | None, bool]:
    """(fractions, checked): (t_k - t0) / (t1 - t0) of the user's save times.

    fractions is None for "t0 and t1", a float64 NumPy array (T,) for concrete
    save times, a traced array for traced ones (a caller's jit or vmap over
    `saveat`). checked says whether every check diffrax makes of the save
    times has passed on the host: True unless they are traced.

    Raises:
        ValueError: not a non-empty 1-D array, or (when concrete) not
            non-decreasing within [t0, t1].
    """
    if saveat is None:
        return None, True
    if is_traced(saveat):
        if saveat.ndim != 1 or saveat.shape[0] == 0:
            raise ValueError(
                "`saveat` must be a non-empty 1-D array of times; got shape "
                f"{saveat.shape}."
            )
        return (saveat - t0) / (t1 - t0), False
    ts = np.asarray(saveat, dtype=np.float64)
    if ts.ndim != 1 or ts.shape[0] == 0:
        raise ValueError(
            f"`saveat` must be a non-empty 1-D array of times; got shape {ts.shape}."
        )
    if not (np.all(np.diff(ts) >= 0) and ts[0] >= t0 and ts[-1] <= t1):
        raise ValueError(
            f"`saveat` must be non-decreasing times within [t0, t1] = [{t0}, {t1}]."
        )
    return np.clip((ts - t0) / (t1 - t0), 0.0, 1.0), True


#: Held while a solve is traced under `checked_on_host` (a process-wide setting).
_ON_ERROR_LOCK = threading.Lock()

#: diffeqsolve without its own jit wrapper, for calls inside a jitted solve
#: (`checked_on_host` must be in force while it is traced, not when a nested jit
#: would trace it).
diffeqsolve_in_jit = getattr(dfx.diffeqsolve, "__wrapped__", dfx.diffeqsolve)


def clock_length(t0: float, t1: float) -> float:
    """L = 2^round(log2(t1 - t0)): the solver's interval is [0, L].

    Computed on the host from concrete times; the solve takes it as a traced
    argument.
    """
    return float(2.0 ** round(math.log2(float(t1) - float(t0))))


def to_t(s: Float[Array, ...], t0, rate) -> Float[Array, ...]:
    """T = t0 + s rate, rate = dt/ds = (t1 - t0) / L."""
    return t0 + s * rate


@contextlib.contextmanager
def checked_on_host(checked: bool):
    """Trace diffrax's own input checks without host callbacks, when they are moot.

    `checked` (from `save_fractions`) says that every runtime check diffrax
    makes of its inputs has already passed on the host. Equinox compiles
    `eqx.error_if` by the mode in `equinox._errors.EQX_ON_ERROR`; while the solve
    is traced it is "nan" (no callback; a failed check would give NaN, and none
    can fail). meanfield's own checks pass `on_error="raise"` explicitly and are
    unaffected. Traced save times keep the default (the checks are then real).
    If a future equinox moves the setting, this does nothing: the solve then
    works as before, only without the persistent cache. The setting is global:
    solves traced in several threads at once (`simulate_ensemble`'s chunks)
    take turns, so that none restores another's setting.
    """
    import equinox._errors as eqx_errors

    if checked and hasattr(eqx_errors, "EQX_ON_ERROR"):
        with _ON_ERROR_LOCK:
            before = eqx_errors.EQX_ON_ERROR
            eqx_errors.EQX_ON_ERROR = "nan"
            try:
                yield
            finally:
                eqx_errors.EQX_ON_ERROR = before
    else:
        yield
