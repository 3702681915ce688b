"""Input validation: ValueError when values are concrete, `eqx.error_if` under tracing.

Static misuse (shapes, options) is always a ValueError at trace time. Value checks
(NaN/inf, simplex, positions in [0, 1], SPD) are ValueErrors for concrete inputs and
runtime errors (`eqx.error_if`) when the inputs are traced under jit/vmap/grad.
"""

import math
import re

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np


def is_traced(*arrays) -> bool:
    """Whether any of `arrays` is an abstract tracer (inside jit/vmap/grad)."""
    return any(isinstance(a, jax.core.Tracer) for a in arrays)


def host_array(x) -> np.ndarray:
    """The array x in NumPy, for checks on the host.

    An array sharded over several processes (`jax.distributed`) cannot be read
    by one process alone: it is gathered from all of them, so every process
    sees the same values and takes the same decision (every process reaches
    the same checks in the same order, so the collective matches up).
    """
    if isinstance(x, jax.Array) and not x.is_fully_addressable:
        from jax.experimental import multihost_utils

        return np.asarray(multihost_utils.process_allgather(x, tiled=True))
    return np.asarray(x)


def check_values(arrays: tuple, bad, message: str) -> tuple:
    """Raise if `bad` (a scalar bool computed from `arrays`) holds.

    Returns `arrays` (threaded through `eqx.error_if` when traced, so the check
    is not dead-code eliminated under jit).
    """
    if is_traced(*arrays, bad):
        # Always a raise: `_clock.checked_on_host` relaxes diffrax's checks only.
        return eqx.error_if(arrays, bad, message, on_error="raise")
    if bool(np.asarray(bad)):
        raise ValueError(message)
    return arrays


# How to take positions at save time i from a result `sol` whose `x` is not (T, n, d)
# positions as they are: a `MergingSolution` pads x with NaN rows past its atoms.
_POSITIONS_AT = {"MergingSolution": "sol.measure({i}).x"}
# Array-likes: converted (or rejected) by NumPy/JAX, never a result object.
_ARRAY_LIKE = (np.ndarray, jax.Array, np.generic, int, float, complex, list, tuple)


def reject_result(
    value,
    name: str,
    where: str,
    *,
    expected: str = "an array of positions (n, d)",
    take: str = "sol.x[{i}]",
    positions: bool = True,
) -> None:
    """TypeError when a result or a measure is passed where one array is expected.

    A `Solution` (the result of `mf.simulate`; also a `MergingSolution`,
    `GaussianSolution` or `DensitySolution`) holds every save time, and a measure
    holds its positions in `.x`: NumPy would read either as an object and fail
    with "float() argument must be ... not 'Solution'". The message says what
    to pass instead. Results are recognised by their fields (save times `ts`
    beside states `x`, `rho` or `mean`; a measure by `x` alone), not by their
    types: the engine does not import the analyses that define some of them.

    Args:
        value: the argument as given.
        name: the argument's name, e.g. "x".
        where: the public function, first in the message, e.g. "clusters".
        expected: what the argument must be, e.g. "an array of positions (n, d)".
        take: how to get it from a result `sol` at save time `{i}`, e.g.
            "sol.x[{i}]" or "sol.measure({i})".
        positions: whether positions are expected, so that a measure is
            rejected too (pointing to its `.x`); False where a measure is.

    Raises:
        TypeError: `value` is a result over save times, or a measure (when
            positions are expected).
    """
    if value is None or isinstance(value, _ARRAY_LIKE):
        return
    if any(getattr(value, p, None) is not None for p in ("__array__", "__jax_array__")):
        return  # converts to an array (a pandas frame may have a column `x`)
    kind = type(value).__name__
    states = (getattr(value, field, None) for field in ("x", "rho", "mean"))
    if getattr(value, "ts", None) is not None and any(s is not None for s in states):
        if take == "sol.x[{i}]":
            take = _POSITIONS_AT.get(kind, take)
        attr = re.search(r"sol\.(\w+)", take)
        if attr and getattr(value, attr.group(1), None) is None:  # another result
            hint = f"it has no `{attr.group(1)}`"
        else:
            hint = (
                f"pass {take.format(i='i')} for save time i "
                f"({take.format(i='-1')} is the last)"
            )
    elif positions and getattr(value, "x", None) is not None:
        hint = "pass its positions `.x`"
    else:
        return
    raise TypeError(f"{where}: `{name}` must be {expected}; got a {kind}: {hint}.")


def _is_host_real(value) -> bool:
    """Whether `value` is a NumPy array or scalar of a real or boolean dtype."""
    if isinstance(value, np.ma.MaskedArray):
        return False
    return isinstance(value, np.ndarray | np.generic) and value.dtype.kind in "fiub"


def as_float_array(value, name: str, dtype=None) -> jax.Array:
    """`jnp.asarray(value)` as a floating dtype; ValueError naming `name` otherwise.

    A NumPy array or scalar of a real or boolean dtype is converted on the host
    and transferred: `jnp.asarray` would compile a program per shape and dtype
    (JAX lifts it with `lax.stage`), ~10 ms of a fresh process's first call.
    """
    if dtype is None and _is_host_real(value):
        host = np.asarray(value)
        if host.dtype.kind != "f":  # as below: the default float dtype
            host = host.astype(jnp.result_type(float))
        # The dtype JAX gives it (float64 is float32 without x64).
        canonical = jax.dtypes.canonicalize_dtype(host.dtype)
        return jax.device_put(host.astype(canonical, copy=False))
    try:
        arr = jnp.asarray(value, dtype=dtype)
    except TypeError as err:
        raise ValueError(
            f"`{name}` must be an array of numbers; got {value!r}."
        ) from err
    if not jnp.issubdtype(arr.dtype, jnp.floating):
        arr = arr.astype(jnp.result_type(float))
    return arr


def real_scalar(value, name: str) -> float:
    """`value` as a Python float; ValueError naming `name` unless one real number.

    Python and NumPy numbers and 0-d arrays pass; strings (even "0.1"), None,
    booleans, complex numbers and arrays with a shape do not. The value itself
    (sign, finiteness) is the caller's to check.
    """
    if (
        isinstance(value, str | bytes | bool | np.bool_)
        or np.ndim(value) != 0
        or np.iscomplexobj(value)
    ):
        raise ValueError(f"`{name}` must be a real number (a scalar); got {value!r}.")
    try:
        return float(value)
    except (TypeError, ValueError) as err:
        raise ValueError(
            f"`{name}` must be a real number (a scalar); got {value!r}."
        ) from err


def check_finite(arr: jax.Array, name: str) -> jax.Array:
    """Reject NaN/inf entries in `arr`.

    Concrete arrays are checked with NumPy: an eager JAX check would compile a
    small program per shape (a fresh process paid ~0.1 s per argument).
    """
    if is_traced(arr):
        bad = jnp.any(~jnp.isfinite(arr))
    else:
        bad = not np.isfinite(np.asarray(arr)).all()
    (arr,) = check_values((arr,), bad, f"`{name}` contains NaN or inf.")
    return arr


def shape_matches(actual: tuple, shape: tuple) -> bool:
    """Whether `actual` equals `shape`, None entries of `shape` matching anything."""
    return len(actual) == len(shape) and all(
        s is None or s == a for s, a in zip(shape, actual, strict=True)
    )


def format_shape(shape: tuple, wildcard: str = "?") -> str:
    """'(2, ?)' style rendering of an expected shape."""
    return "(" + ", ".join(wildcard if s is None else str(s) for s in shape) + ")"


def check_shape(arr: jax.Array, shape: tuple, name: str, meaning: str) -> None:
    """ValueError unless `arr.shape == shape` (None entries match anything)."""
    if not shape_matches(arr.shape, shape):
        raise ValueError(
            f"`{name}` must have shape {meaning} = {format_shape(shape)}; "
            f"got shape {arr.shape}."
        )


def check_finite_times(**times) -> None:
    """ValueError unless every time is a concrete, finite number.

    `t1=inf` has no solve; a traced time (under jax.jit or jax.vmap) cannot set
    the compile-time constants the solves derive from it (the solver clock's
    length, the save fractions, a layer's step).
    """
    for name, value in times.items():
        if is_traced(value):
            raise ValueError(
                f"`{name}` must be a concrete number, not an array traced by "
                "jax.jit or jax.vmap: the compiled solve depends on its value (the "
                "solver clock's length, the save fractions). Pass it as a static "
                "argument or close over it; one compilation serves times of about "
                "the same length."
            )
        if not math.isfinite(float(value)):
            raise ValueError(f"`{name}` must be a finite time; got {value}.")


def check_tolerances(rtol, atol) -> None:
    """ValueError unless rtol, atol are finite, >= 0 and not both 0.

    0 is accepted for one of them (pure absolute or relative control); inf would
    accept any step, NaN none. A tolerance below the dtype's resolution is
    accepted (atol = 1e-300 is meaningful for tokens of that size): where it
    cannot be met the step falls to the floor and the solve ends "failed".
    """
    for name, value in (("rtol", rtol), ("atol", atol)):
        if not (float(value) >= 0 and math.isfinite(float(value))):
            raise ValueError(f"`{name}` must be >= 0 and finite; got {value}.")
    if not (float(rtol) > 0 or float(atol) > 0):
        raise ValueError(
            "`rtol` and `atol` must not both be 0: the adaptive step would shrink "
            "to nothing."
        )
