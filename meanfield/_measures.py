"""Measures on R^d: weighted particles, masked particles, Gaussians.

All are `eqx.Module` pytrees, validated once at construction. Inside solvers
swap leaves with `eqx.tree_at` instead of re-constructing (no re-validation).
"""

import abc

import equinox as eqx
import jax
import jax.numpy as jnp
import jax.random as jr
import numpy as np
from jaxtyping import Array, ArrayLike, Float, PRNGKeyArray

from . import _compile_cache
from ._checks import (
    as_float_array,
    check_finite,
    check_shape,
    check_values,
    is_traced,
    reject_result,
)

# Every engine path goes through a measure: the persistent compilation cache is
# set up here, before anything compiles (`_compile_cache`).
_compile_cache.enable()


def _with_simplex_weights(x, weights) -> tuple[Float[Array, "n d"], Float[Array, " n"]]:
    """(x, w) with w validated on the simplex (uniform 1/n when `weights` is None).

    The check is threaded through x as well: under jit a check on `w` alone is
    dead-code eliminated when only `x` is used downstream.
    """
    n, dtype = x.shape[0], x.dtype
    if weights is None:
        # Built on the host and transferred: an eager jnp.full, or jnp.asarray of
        # a NumPy array, compiles a program per shape.
        return x, jax.device_put(np.full((n,), 1.0 / n, dtype=dtype))
    w = as_float_array(weights, "weights").astype(dtype)
    check_shape(w, (n,), "weights", "(n,)")
    return check_simplex(x, w)


def check_simplex(x, w) -> tuple[Array, Array]:
    """(x, w), raising unless every row of w (..., n) is a point of the simplex.

    The weights' check of `Particles`, for weights of any leading shape: finite,
    nonnegative, summing to 1 along the last axis to max(n, 16) ulps of w's
    dtype (a length-n sum is exact to about n ulps). A ValueError for concrete
    weights, checked on the host; `eqx.error_if` threaded through (x, w) for
    traced ones (a check on w alone is dead-code eliminated under jit when only
    x is used downstream).
    """
    n = w.shape[-1]
    tol = max(n, 16) * jnp.finfo(w.dtype).eps
    if is_traced(x, w):
        x, w = check_values(
            (x, w), jnp.any(~jnp.isfinite(w)), "`weights` contains NaN or inf."
        )
        bad = jnp.any(w < 0) | jnp.any(jnp.abs(jnp.sum(w, axis=-1) - 1) > tol)
    else:  # on the host: eager checks would compile small programs
        w = check_finite(w, "weights")
        host = np.asarray(w)
        total = host.sum(axis=-1, dtype=host.dtype)
        bad = bool(np.any(host < 0) or np.any(np.abs(total - 1) > tol))
    return check_values(
        (x, w),
        bad,
        "`weights` must be nonnegative and sum to 1 (a point of the simplex).",
    )


def _points(x, name: str = "x", where: str = "Particles") -> Float[Array, "n d"]:
    reject_result(x, name, where)
    x = as_float_array(x, name)
    if x.ndim != 2 or x.shape[0] == 0 or x.shape[1] == 0:
        raise ValueError(
            f"`{name}` must have shape (n, d) with n, d >= 1; got shape {x.shape}."
        )
    return check_finite(x, name)


class AbstractMeasure(eqx.Module):
    """A probability measure on R^d (or on [0, 1] x R^d for masked particles)."""

    @property
    @abc.abstractmethod
    def dim(self) -> int:
        """Dimension d of the token space."""


class AbstractParticles(AbstractMeasure):
    """Weighted empirical measure sum_i w_i delta_{x_i}."""

    x: eqx.AbstractVar[Float[Array, "n d"]]
    weights: eqx.AbstractVar[Float[Array, " n"]]

    @property
    def dim(self) -> int:
        """Dimension d of the token space."""
        return self.x.shape[-1]

    @property
    def n(self) -> int:
        """Number of atoms n."""
        return self.x.shape[-2]


class Particles(AbstractParticles):
    """Weighted empirical measure mu = sum_i w_i delta_{x_i} on R^d.

    Args:
        x: atom locations, shape (n, d).
        weights: shape (n,), nonnegative and summing to 1; None means uniform 1/n.

    Raises:
        ValueError: wrong shapes, NaN/inf, or weights not on the simplex.
        TypeError: `x` is a `Solution` (pass `sol.x[i]`) or a measure.
    """

    x: Float[Array, "n d"]
    weights: Float[Array, " n"]

    def __init__(self, x: ArrayLike, weights: ArrayLike | None = None):
        self.x, self.weights = _with_simplex_weights(_points(x), weights)


class MaskedParticles(AbstractParticles):
    """Particles carrying a position s in [0, 1]: sum_i w_i delta_{(s_i, x_i)}.

    Causal (masked) attention, Castin et al. (2025), Def. 2.6: token i attends to
    token j iff s_j <= s_i. With s_i = i / n this is discrete causal attention. The
    position coordinate never moves under the dynamics.

    Args:
        x: atom locations, shape (n, d).
        positions: s, shape (n,), in [0, 1].
        weights: shape (n,), on the simplex; None means uniform 1/n.

    Raises:
        ValueError: wrong shapes, NaN/inf, weights not on the simplex, or positions
            outside [0, 1].
        TypeError: `x` is a `Solution` (pass `sol.x[i]`) or a measure.
    """

    x: Float[Array, "n d"]
    positions: Float[Array, " n"]
    weights: Float[Array, " n"]

    def __init__(
        self, x: ArrayLike, positions: ArrayLike, weights: ArrayLike | None = None
    ):
        x = _points(x, where="MaskedParticles")
        n = x.shape[0]
        s = as_float_array(positions, "positions").astype(x.dtype)
        check_shape(s, (n,), "positions", "(n,)")
        if is_traced(x, s):
            x, s = check_values(
                (x, s), jnp.any(~jnp.isfinite(s)), "`positions` contains NaN or inf."
            )
            outside = jnp.any((s < 0) | (s > 1))
        else:  # on the host: eager checks would compile small programs
            s = check_finite(s, "positions")
            outside = bool(np.any((np.asarray(s) < 0) | (np.asarray(s) > 1)))
        x, s = check_values((x, s), outside, "`positions` must lie in [0, 1].")
        self.x, self.weights = _with_simplex_weights(x, weights)
        self.positions = s


class Gaussian(AbstractMeasure):
    """Gaussian measure N(mean, cov) on R^d.

    Args:
        mean: shape (d,).
        cov: shape (d, d), symmetric positive definite.

    Raises:
        ValueError: wrong shapes, NaN/inf, or `cov` not symmetric positive definite.
    """

    mean: Float[Array, " d"]
    cov: Float[Array, "d d"]

    def __init__(self, mean: ArrayLike, cov: ArrayLike):
        mean = as_float_array(mean, "mean")
        if mean.ndim != 1 or mean.shape[0] == 0:
            raise ValueError(f"`mean` must have shape (d,); got shape {mean.shape}.")
        d = mean.shape[0]
        cov = as_float_array(cov, "cov").astype(mean.dtype)
        check_shape(cov, (d, d), "cov", "(d, d)")
        mean, cov = check_finite(mean, "mean"), check_finite(cov, "cov")
        scale = jnp.max(jnp.abs(cov))
        # Symmetric up to rounding of a d-term product; PD by the smallest eigenvalue.
        asym = (
            jnp.max(jnp.abs(cov - cov.T)) > 100 * d * jnp.finfo(cov.dtype).eps * scale
        )
        mean, cov = check_values((mean, cov), asym, "`cov` must be symmetric.")
        sym = (cov + cov.T) / 2
        not_pd = jnp.linalg.eigvalsh(sym)[0] <= 0
        mean, sym = check_values(
            (mean, sym), not_pd, "`cov` must be positive definite."
        )
        self.mean = mean
        self.cov = sym

    @property
    def dim(self) -> int:
        """Dimension d."""
        return self.mean.shape[0]

    def sample(self, key: PRNGKeyArray, n: int) -> Particles:
        """Draw n i.i.d. samples as uniform particles.

        Args:
            key: a JAX PRNG key.
            n: number of samples.

        Returns:
            `Particles` with x of shape (n, d) and weights 1/n.

        Raises:
            ValueError: `n` not a positive integer.
        """
        # A shape: checked here, or XLA fails on it with no argument's name.
        try:
            ok = not isinstance(n, bool) and int(n) == n and n >= 1
        except (TypeError, ValueError):  # None, a string, NaN, a traced value
            ok = False
        if not ok:
            raise ValueError(f"`n` must be a positive integer; got {n!r}.")
        chol = jnp.linalg.cholesky(self.cov)
        z = jr.normal(key, (int(n), self.dim), dtype=self.mean.dtype)
        x = self.mean[None, :] + z @ chol.T
        return Particles(x)
