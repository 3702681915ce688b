"""The solver clock: s in [0, L], t = t0 + s (t1 - t0) / L, L a power of two.

JAX never writes a program holding a host callback to its persistent
compilation cache, and diffrax checks its save times (non-decreasing, inside
[t0, t1]) with `eqx.error_if`, whose runtime check is a host callback whenever
the times are staged, which they always are inside a jit. So `simulate` and
`gaussian.simulate` integrate in s on [0, L], L = 2^round(log2(t1 - t0)):
- the save fractions (t_k - t0) / (t1 - t0) are checked here on the host and
  become compile-time constants, rounded to FRACTION_DIGITS digits so that equal
  grids (the equal segments of one run, `linspace` saves over horizons with the
  same L) share one compilation; diffrax's repeat of the check is then compiled
  without its callback (`checked_on_host`);
- t0 and t1 stay traced: a new interval of about the same length (within a
  factor sqrt(2) of L) reuses the compiled solve.
dt/ds = (t1 - t0) / L is within a factor sqrt(2) of 1, so the field, the step
sizes and their floors keep the magnitudes they have in t (a unit interval would
multiply the field by t1 - t0 and overflow it for long horizons), and s resolves
t - t0 to its own ulps: nothing is lost against integrating in t. Step and
blow-up rules are evaluated in t (`to_t`).
"""

from __future__ import annotations

import contextlib
import math

import diffrax as dfx
import numpy as np
from jaxtyping import Array, ArrayLike, Float

from ._checks import is_traced

#: Save fractions are rounded to this many decimals: a save time moves by at most
#: 5e-13 (t1 - t0), below float64's step-size control and float32's resolution.
FRACTION_DIGITS = 12


def save_fractions(
    saveat: ArrayLike | None, t0: float, t1: float
) -> tuple[float, ...] | Array | None:
    """(t_k - t0) / (t1 - t0) of the user's save times; None for "t0 and t1".

    Concrete save times give a tuple of Python floats (static under
    `eqx.filter_jit`); traced ones (a caller's jit or vmap over `saveat`) give a
    traced array: that still works, only without the persistent cache.

    Raises:
        ValueError: not a non-empty 1-D array, or (when concrete) not
            non-decreasing within [t0, t1].
    """
    if saveat is None:
        return None
    if is_traced(saveat):
        if saveat.ndim != 1 or saveat.shape[0] == 0:
            raise ValueError(
                "`saveat` must be a non-empty 1-D array of times; got shape "
                f"{saveat.shape}."
            )
        return (saveat - t0) / (t1 - t0)
    ts = np.asarray(saveat, dtype=np.float64)
    if ts.ndim != 1 or ts.shape[0] == 0:
        raise ValueError(
            f"`saveat` must be a non-empty 1-D array of times; got shape {ts.shape}."
        )
    if not (np.all(np.diff(ts) >= 0) and ts[0] >= t0 and ts[-1] <= t1):
        raise ValueError(
            f"`saveat` must be non-decreasing times within [t0, t1] = [{t0}, {t1}]."
        )
    fractions = np.clip(np.round((ts - t0) / (t1 - t0), FRACTION_DIGITS), 0.0, 1.0)
    return tuple(float(f) for f in fractions)


#: diffeqsolve without its own jit wrapper, for calls inside a jitted solve: the
#: clock's constants (its length, the save fractions) then stay constants. Under
#: the wrapper they would become traced arguments of its jit.
diffeqsolve_in_jit = getattr(dfx.diffeqsolve, "__wrapped__", dfx.diffeqsolve)


def clock_length(t0: float, t1: float) -> float:
    """L = 2^round(log2(t1 - t0)): the solver's interval is [0, L] (static)."""
    return float(2.0 ** round(math.log2(float(t1) - float(t0))))


def to_t(s: Float[Array, ...], t0, rate) -> Float[Array, ...]:
    """T = t0 + s rate, rate = dt/ds = (t1 - t0) / L."""
    return t0 + s * rate


@contextlib.contextmanager
def checked_on_host(fractions):
    """Trace diffrax's own input checks without host callbacks, when they are moot.

    With static save fractions (validated by `save_fractions`) every runtime check
    diffrax makes of its inputs has already passed on the host. Equinox compiles
    `eqx.error_if` by the mode in `equinox._errors.EQX_ON_ERROR`; while the solve
    is traced it is "nan" (no callback; a failed check would give NaN, and none
    can fail). meanfield's own checks pass `on_error="raise"` explicitly and are
    unaffected. Traced fractions keep the default (the checks are then real). If
    a future equinox moves the setting, this does nothing: the solve then works as
    before, only without the persistent cache. Not for concurrent tracing from
    several threads.
    """
    import equinox._errors as eqx_errors

    if isinstance(fractions, tuple) and hasattr(eqx_errors, "EQX_ON_ERROR"):
        before = eqx_errors.EQX_ON_ERROR
        eqx_errors.EQX_ON_ERROR = "nan"
        try:
            yield
        finally:
            eqx_errors.EQX_ON_ERROR = before
    else:
        yield
