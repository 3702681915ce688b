"""Rescaled tokens z_i(t) = e^{-tV} x_i(t) (Geshkovski et al., 2023).

The only part of the clustering analysis that runs in JAX: one matrix exponential
per save time, compiled once per shape.
"""

import jax
import jax.numpy as jnp
from jaxtyping import Array, ArrayLike, Float

from .._linalg import expm


def rescale(sol, V: Float[ArrayLike, "d d"]) -> Float[Array, "T n d"]:
    """Rescaled trajectories z_i(t) = e^{-tV} x_i(t) (Geshkovski et al., 2023).

    For x_i' = V x_i + (attention-weighted mean of V x_j) the factor e^{-tV} removes
    the linear growth, so z stays bounded and clusters; with V = I it is
    z(t) = e^{-t} x(t). The matrix exponential is taken at every save time, so any
    V works (not only symmetric or diagonalisable ones): `jax.scipy.linalg.expm`
    with our own scaling and squaring (`meanfield._linalg.expm`), compiled once
    per shape.

    See [Rescaling][math-rescaling].

    Args:
        sol: a `Solution`, or anything with `ts` (T,) and `x` (T, n, d).
        V: value matrix, shape (d, d).

    Returns:
        z, shape (T, n, d), in the dtype of `sol.x`. Rows of save times that were not
        reached (ts = +inf) stay +inf, never NaN.

    Raises:
        ValueError: `sol.x` is not (T, n, d), `sol.ts` is not (T,), or `V` is not
            (d, d).
    """
    ts, x = jnp.asarray(sol.ts), jnp.asarray(sol.x)
    if not jnp.issubdtype(x.dtype, jnp.floating):
        x = x.astype(jnp.result_type(float))
    if x.ndim != 3 or ts.shape != x.shape[:1]:
        raise ValueError(
            "`sol` must have `ts` of shape (T,) and `x` of shape (T, n, d); got "
            f"{ts.shape} and {x.shape}."
        )
    d = x.shape[-1]
    V = jnp.asarray(V, x.dtype)
    if V.shape != (d, d):
        raise ValueError(f"`V` must have shape ({d}, {d}); got {V.shape}.")
    # Exponentials in >= float32 (expm has no half-precision Pade coefficients).
    work = jnp.promote_types(x.dtype, jnp.float32)
    return _rescale_arrays(ts, x.astype(work), V.astype(work)).astype(x.dtype)


@jax.jit
def _rescale_arrays(ts, x, V):
    # Compiled once per shape: expm run op by op costs more than its compilation.
    reached = jnp.isfinite(ts)
    # expm(-inf V) is NaN: evaluate at t = 0 and restore the +inf rows afterwards.
    t_safe = jnp.where(reached, ts, 0).astype(x.dtype)
    propagators = jax.vmap(lambda t: expm(-t * V))(t_safe)  # (T, d, d)
    z = jnp.einsum("tij,tnj->tni", propagators, x)
    return jnp.where(reached[:, None, None], z, jnp.inf)
