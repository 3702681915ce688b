"""Time-dependent attention parameters.

Any attention parameter may be an array or a function t -> array. Functions stored
as `eqx.Module`s (such as `PiecewiseConstant`) keep their arrays as pytree leaves,
so a plain `jax.jit` works; bare Python callables need `eqx.filter_jit`.
"""

from collections.abc import Callable

import equinox as eqx
import jax.numpy as jnp
from jaxtyping import Array, ArrayLike, Float

from ._checks import as_float_array, check_finite, check_values


class PiecewiseConstant(eqx.Module):
    """Piecewise-constant parameter: one value per layer on [t0, t1].

    Layer l holds on [t0 + l h, t0 + (l + 1) h), h = (t1 - t0) / L; times before t0
    (after t1) use the first (last) value. With `mf.layers(..., L, t1=t1)` layer l of
    the discrete Transformer uses value l exactly.

    Args:
        values: shape (L, ...), one parameter array per layer.
        t0: start time.
        t1: end time.

    Example:
        >>> V = PiecewiseConstant(jnp.stack([jnp.eye(2), 2 * jnp.eye(2)]), t1=1.0)
        >>> V(0.75)  # second layer: 2 I
    """

    values: Float[Array, "L ..."]
    t0: float = eqx.field(static=True)
    t1: float = eqx.field(static=True)

    def __init__(self, values: ArrayLike, *, t0: float = 0.0, t1: float = 1.0):
        values = check_finite(as_float_array(values, "values"), "values")
        if values.ndim < 1 or values.shape[0] == 0:
            raise ValueError(
                f"`values` must have shape (L, ...) with L >= 1; got {values.shape}."
            )
        if not t1 > t0:
            raise ValueError(f"`t1` must be greater than `t0`; got t0={t0}, t1={t1}.")
        self.values, self.t0, self.t1 = values, float(t0), float(t1)

    def __call__(self, t) -> Float[Array, "..."]:
        """Value at time t."""
        num_layers = self.values.shape[0]
        u = (jnp.asarray(t) - self.t0) / (self.t1 - self.t0) * num_layers
        # Layer boundaries l*h computed in floating point may land a few ulps below
        # l: nudge up so that t = l*h selects layer l, not l - 1.
        u = u + 64 * jnp.finfo(jnp.result_type(u, float)).eps * num_layers
        idx = jnp.clip(jnp.floor(u).astype(jnp.int32), 0, num_layers - 1)
        # A NaN time has no layer: NaN out, not layer 0 (where int(NaN) lands).
        return jnp.where(jnp.isnan(u), jnp.nan, self.values[idx])


def as_param(value, name: str):
    """Converter for attention parameters: arrays are validated, callables kept."""
    if value is None:
        return None
    if callable(value):
        return value
    return check_finite(as_float_array(value, name), name)


def at(param, t, name: str = "parameter") -> Array:
    """Evaluate a parameter at time t (arrays are constant in time).

    A function's value is checked at every evaluation: NaN or inf raises (a
    ValueError when concrete, a runtime error inside a jitted solve) naming the
    parameter, instead of turning the field into NaN that a solver would read as
    a blow-up.
    """
    if isinstance(param, Callable):
        value = jnp.asarray(param(t))
        (value,) = check_values(
            (value,),
            jnp.any(~jnp.isfinite(value)),
            f"`{name}` (a function of t) returned NaN or inf: it must be finite at "
            "every time the solver evaluates it.",
        )
        return value
    return param
