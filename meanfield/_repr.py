"""Short reprs of result objects: key numbers by value, large arrays by shape.

A result printed at a prompt should answer "what came out?" in one line:
`LipschitzResult(value=31.99, converged=True, iterations=17, ...)`, not a dump of
an (n, d) direction, nor only `f64[]` for every scalar (equinox's default repr of
a module, which shows shapes and never values).
"""

import jax
import numpy as np

from . import _status

#: Arrays with at most this many entries are shown by value (a study's 12 sizes or
#: layers); larger ones by dtype and shape, as equinox shows them (f64[3,4,2]).
SMALL = 12

_DTYPES = {
    "float64": "f64",
    "float32": "f32",
    "float16": "f16",
    "bfloat16": "bf16",
    "int64": "i64",
    "int32": "i32",
    "int8": "i8",
    "uint32": "u32",
    "bool": "bool",
}


def _shape(arr) -> str:
    dtype = _DTYPES.get(str(arr.dtype), str(arr.dtype))
    return f"{dtype}[{','.join(str(s) for s in arr.shape)}]"


def _number(value) -> str:
    if isinstance(value, bool | np.bool_):
        return str(bool(value))
    if isinstance(value, int | np.integer):
        return str(int(value))
    return f"{float(value):.6g}"


def brief(value) -> str:
    """One short line for a field value.

    Numbers are shown with 6 significant digits, arrays of at most `SMALL` entries
    as a list (1-D) of such numbers, larger arrays (and any array traced under
    jit/vmap, whose values are unknown) as dtype[shape]; dicts, tuples and lists
    element by element; other objects by their own repr.

    Args:
        value: the value of a field.

    Returns:
        The text.
    """
    if isinstance(value, jax.core.Tracer):
        return _shape(value)
    if isinstance(value, np.ndarray | jax.Array | np.generic):
        arr = np.asarray(value)
        if arr.dtype.kind not in "biuf":  # strings, objects: NumPy's own print
            return _shape(arr) if arr.size > SMALL else repr(arr.tolist())
        if arr.ndim == 0:
            return _number(arr.item())
        if arr.ndim == 1 and arr.size <= SMALL:
            return "[" + ", ".join(_number(v) for v in arr.tolist()) + "]"
        return _shape(arr)
    if isinstance(value, bool | int | float):
        return _number(value)
    if isinstance(value, dict):
        return "{" + ", ".join(f"{k!r}: {brief(v)}" for k, v in value.items()) + "}"
    if isinstance(value, list):
        return "[" + ", ".join(brief(v) for v in value) + "]"
    if isinstance(value, tuple):
        items = [brief(v) for v in value]
        return "(" + ", ".join(items) + ("," if len(items) == 1 else "") + ")"
    return repr(value)


def fields_repr(obj, **fields) -> str:
    """`Type(name=brief(value), ...)` over the given fields, in their order.

    Args:
        obj: the object whose type names the repr.
        **fields: the values to show, key values first.

    Returns:
        The repr.
    """
    inner = ", ".join(f"{name}={brief(value)}" for name, value in fields.items())
    return f"{type(obj).__name__}({inner})"


def status_brief(codes):
    """What a repr shows of result codes (`Status`).

    Args:
        codes: one result code, or an array of them (an ensemble's).

    Returns:
        The name of one code; {name: count} for an array of them; the codes
        themselves when traced under jit/vmap (shown by shape).
    """
    if isinstance(codes, jax.core.Tracer):
        return codes
    names = _status.names(codes)
    if np.ndim(names) == 0:
        return names
    kinds, counts = np.unique(names.astype(str), return_counts=True)
    return {str(k): int(c) for k, c in zip(kinds, counts, strict=True)}
