"""Statistics of token directions for studies over many systems and save times.

The order parameter |sum_i w_i theta_i| (the Kuramoto order parameter on S^1),
the number of groups of aligned tokens, and `statistics`, which gathers them with
`pair_alignment` at every save time of a `Solution` and serves as the `reduce` of
`mf.simulate_ensemble`: a study over thousands of noisy systems keeps (B, T)
numbers instead of (B, T, n, d) trajectories. All are JAX functions of the
tokens (jit- and vmap-able); a system holding a non-finite token gives NaN.
"""

import equinox as eqx
import jax
import jax.numpy as jnp
from jaxtyping import Array, ArrayLike, Float

from .._checks import as_float_array, reject_result
from .._dynamics import Solution
from .._measures import check_simplex
from .._repr import fields_repr
from ._phase import pair_alignment


def _tokens(x, name: str) -> Array:
    if isinstance(x, Solution):  # unreached save times hold +inf: NaN below
        x = x.x
    reject_result(x, name, name, expected="an array of tokens (..., n, d)")
    x = jnp.asarray(x)
    if x.ndim < 2 or x.shape[-2] < 1:
        raise ValueError(f"`x` must have shape (..., n, d) with n >= 1; got {x.shape}.")
    return x


def _directions(x: Array) -> Array:
    return x / jnp.linalg.norm(x, axis=-1, keepdims=True)


def order_parameter(
    x: Float[ArrayLike, "... n d"] | Solution,
    weights: Float[ArrayLike, "... n"] | None = None,
) -> Array:
    """|sum_i w_i theta_i| with theta_i = x_i / |x_i|: 1 for one cluster.

    On S^1 this is the Kuramoto order parameter |sum_i w_i e^{i theta_i}|. For n
    independent uniform directions it is of order 1/sqrt(n) (its mean square is
    sum_i w_i^2); it stays of order 1 when the tokens gather. See
    [Statistics of noisy ensembles][math-noise-statistics].

    Args:
        x: tokens, shape (..., n, d), any leading axes (systems, save times); a
            `Solution` stands for `sol.x` and its initial measure's weights.
        weights: (..., n) nonnegative weights summing to 1 (default uniform
            1/n, or the `Solution`'s weights).

    Returns:
        Shape (...): NaN where a system holds a non-finite token.

    Raises:
        ValueError: `x` not of shape (..., n, d), `weights` without last axis n,
            or weights that are negative, not finite or do not sum to 1 (under
            jax.jit: a runtime error, as `Particles` raises).
    """
    if weights is None and isinstance(x, Solution):
        # (..., n) weights of the initial measures, one per save time (..., T, n):
        # checked on the simplex when the measure was made.
        x, w = _tokens(x, "x"), jnp.expand_dims(x.initial.weights, -2)
    else:
        x = _tokens(x, "x")
        n = x.shape[-2]
        if weights is None:
            w = jnp.full((n,), 1 / n, x.dtype)
        else:
            w = as_float_array(weights, "weights").astype(x.dtype)
            if w.shape[-1:] != (n,):
                raise ValueError(
                    f"`weights` must have last axis n = {n}; got {w.shape}."
                )
            x, w = check_simplex(x, w)  # as `Particles` checks its weights
    w = jnp.broadcast_to(w, x.shape[:-1])  # explicit: leading axes may be absent
    mean = jnp.sum(w[..., None] * _directions(x), axis=-2)
    value = jnp.linalg.norm(mean, axis=-1)
    return jnp.where(jnp.all(jnp.isfinite(x), axis=(-2, -1)), value, jnp.nan)


def _components(theta: Array, eps) -> Array:
    """Connected components of {<theta_i, theta_j> > 1 - eps}, for (n, d)."""
    n = theta.shape[0]
    linked = theta @ theta.T > 1 - eps
    labels = jnp.arange(n)

    # Each token takes the smallest label among its neighbours until nothing
    # changes: at most n rounds of an (n, n) min, for the small n of a study.
    def spread(state):
        labels, _ = state
        new = jnp.min(jnp.where(linked, labels[None, :], n), axis=1)
        return new, jnp.any(new != labels)

    labels, _ = jax.lax.while_loop(lambda s: s[1], spread, (labels, jnp.array(True)))
    return jnp.sum(labels == jnp.arange(n))


def aligned_groups(
    x: Float[ArrayLike, "... n d"] | Solution, eps: float = 1e-3
) -> Array:
    """Number of groups of aligned tokens: clusters of the alignment graph.

    Tokens i and j are linked when <theta_i, theta_j> > 1 - eps; the groups are
    the connected components (single linkage at that threshold), so 1 means
    one cluster and n means no two tokens aligned. Unlike
    `cluster_counts`, whose tolerance adapts to each configuration, the
    threshold is fixed, which is what an ensemble statistic needs; it costs
    O(n^2 d) per round of label spreading (at most n rounds): meant for the
    small systems of a study (n up to a few hundred).

    Args:
        x: tokens, shape (..., n, d) (or a `Solution`, for its `x`).
        eps: alignment tolerance on the inner product of directions, in (0, 2).

    Returns:
        Integer-valued float array of shape (...): NaN where a system holds a
        non-finite token.
    """
    x = _tokens(x, "x")
    if not 0 < eps < 2:
        raise ValueError(f"`eps` must be in (0, 2); got {eps}.")
    flat = _directions(x.reshape((-1,) + x.shape[-2:]))
    counts = jax.vmap(lambda t: _components(t, eps))(flat).astype(x.dtype)
    finite = jnp.all(jnp.isfinite(flat), axis=(-2, -1))
    return jnp.where(finite, counts, jnp.nan).reshape(x.shape[:-2])


class Statistics(eqx.Module):
    """Per-system statistics at every save time (the output of `statistics`).

    Attributes:
        ts: save times, shape (..., T) (+inf where not reached).
        order_parameter: |sum_i w_i theta_i|, shape (..., T).
        pair_alignment: fraction of aligned pairs (<theta_i, theta_j> > 1 - eps),
            shape (..., T).
        groups: number of groups of aligned tokens, shape (..., T).
        result: the solve's status code (`mf.Status`), shape (...).
    """

    ts: Array
    order_parameter: Array
    pair_alignment: Array
    groups: Array
    result: Array

    def __repr__(self) -> str:
        return fields_repr(self)


def statistics(sol: Solution, eps: float = 1e-3) -> Statistics:
    """Order parameter, pair alignment and aligned groups at every save time.

    Pass it as `reduce=mf.clustering.statistics` to `mf.simulate_ensemble` (or
    `eqx.Partial(mf.clustering.statistics, eps=...)`): it runs inside each
    chunk's compiled program, so only (B, T) numbers leave it. See
    [Statistics of noisy ensembles][math-noise-statistics].

    Args:
        sol: a `Solution` ((T, n, d) tokens, or (B, T, n, d) inside an
            ensemble's `reduce`).
        eps: alignment tolerance of `pair_alignment` and `aligned_groups`.

    Returns:
        `Statistics` with the leading axes of `sol`.
    """
    if not isinstance(sol, Solution):
        raise TypeError(
            f"`sol` must be a `Solution`; got {type(sol).__name__} (for arrays of "
            "tokens use `order_parameter`, `pair_alignment`, `aligned_groups`)."
        )
    return Statistics(
        ts=sol.ts,
        order_parameter=order_parameter(sol),
        pair_alignment=pair_alignment(sol.x, eps),
        groups=aligned_groups(sol.x, eps),
        result=sol.result,
    )
