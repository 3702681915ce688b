"""Tokens from a density on S^2: point values of its harmonics and exact sampling.

The cross-check of `simulate_sphere` against particles: draw tokens from the
band-limited density, run them with `mf.simulate(..., normalization="sphere")`,
and compare them with the density at a later time. The density sampled is the
band-limited interpolant sum_{l < L} a_lm Y_lm of the grid values (the function
the solver evolves), not a piecewise-constant surrogate: rejection sampling with
uniform proposals on S^2, the interpolant evaluated at each proposal by its
spherical-harmonic series (`sphere_values`).
"""

import functools

import jax
import jax.numpy as jnp
import jax.random as jr
import numpy as np
from jaxtyping import Array, ArrayLike, Complex, Float

from . import _harmonics as sh
from ._harmonics import grid_size, sphere_grid

# Grid values below -this * max are a negative density, not rounding (as the
# solver's "negative" status); smaller undershoots are read as 0.
_NEGATIVE_TOL = 1e-6
# Proposals per batch of the rejection loop: ~L^2 flops each, so 2^14 proposals
# at L = 64 are ~7e7 multiply-adds (tens of ms on a CPU core).
_BATCH = 2**14


@jax.jit
def sphere_values(
    coeffs: Complex[ArrayLike, "L L"], x: Float[ArrayLike, "n 3"]
) -> Float[Array, " n"]:
    """f(x) = sum_{l < L} sum_{|m| <= l} a_lm Y_lm(x) at arbitrary points of S^2.

    The series of `_harmonics` (orthonormal Y_lm = Pbar_l^m(cos theta) e^{i m
    phi}, no Condon-Shortley phase, f real: only m >= 0 stored), evaluated by
    the same stable recurrences as the grid's tables, all orders m at once:
    Pbar_m^m = sqrt((2m + 1) / (2m)) sin(theta) Pbar_{m-1}^{m-1}, then
    Pbar_l^m = a_lm (cos(theta) Pbar_{l-1}^m - b_lm Pbar_{l-2}^m) in a scan over
    l - m that accumulates S_m = sum_l a_lm Pbar_l^m, so memory is O(L n), not
    the O(L^2 n) table. f = Re S_0 + 2 sum_{m >= 1} Re(S_m e^{i m phi}).
    O(L^2 n) flops; jittable, vmappable.

    Args:
        coeffs: complex coefficients, shape (L, L), indexed [l, m] (m >= 0; 0
            for m > l), e.g. `SphereSolution.coefficients(i)`.
        x: points, shape (n, 3), on the unit sphere (not renormalised).

    Returns:
        The real values f(x_i), shape (n,).
    """
    a = jnp.asarray(coeffs)
    x = jnp.asarray(x)
    L = a.shape[-1]
    dtype = x.dtype
    ct = jnp.clip(x[:, 2], -1, 1)
    st = jnp.sqrt(jnp.maximum(1 - ct**2, 0))
    phi = jnp.arctan2(x[:, 1], x[:, 0])
    m = np.arange(L, dtype=np.float64)
    # Diagonal Pbar_m^m (L, n) by a cumulative product (underflows to 0 near the
    # poles at large m: those values are negligible, as in the grid's tables).
    ratio = np.sqrt((2 * m[1:] + 1) / (2 * m[1:]))
    factors = jnp.concatenate(
        [
            jnp.full((1, ct.shape[0]), 1 / np.sqrt(4 * np.pi), dtype),
            jnp.asarray(ratio, dtype)[:, None] * st[None, :],
        ]
    )
    diag = jnp.cumprod(factors, axis=0)
    # Coefficient a[m + k, m] for every m at step k: pad l up to 2L (zeros).
    a_pad = jnp.concatenate([a, jnp.zeros_like(a)], axis=0)
    m_arr = jnp.asarray(m, dtype)
    cols = jnp.arange(L)

    def step(carry, k):
        p_prev, p_prev2, acc = carry
        ell = m_arr + k.astype(dtype)
        alpha = jnp.sqrt((4 * ell**2 - 1) / (ell**2 - m_arr**2))
        # b = 0 at k = 1 ((l - 1)^2 = m^2): Pbar_{m+1}^m = a cos(theta) Pbar_m^m.
        b = jnp.sqrt(((ell - 1) ** 2 - m_arr**2) / (4 * (ell - 1) ** 2 - 1))
        p = alpha[:, None] * (ct[None, :] * p_prev - b[:, None] * p_prev2)
        # Rows with l = m + k >= L meet the zero padding.
        c = a_pad[cols + k, cols]
        return (p, p_prev, acc + c[:, None] * p), None

    acc0 = a[cols, cols][:, None] * diag
    (_, _, acc), _ = jax.lax.scan(
        step, (diag, jnp.zeros_like(diag), acc0), jnp.arange(1, L)
    )
    phase = jnp.exp(1j * jnp.asarray(m, dtype)[:, None] * phi[None, :])
    terms = jnp.real(acc * phase)
    weight = jnp.asarray(np.where(m == 0, 1.0, 2.0), dtype)
    return weight @ terms


def _check_n(n) -> int:
    if isinstance(n, bool) or not isinstance(n, int | np.integer) or n < 1:
        raise ValueError(f"`n` must be a positive integer; got {n!r}.")
    return int(n)


def _grid_values(rho) -> np.ndarray:
    rho = np.asarray(rho, np.float64)
    L = rho.shape[1] // 3 if rho.ndim == 2 else 0
    if rho.ndim != 2 or L < 2 or rho.shape != grid_size(L):
        raise ValueError(
            "`rho` must have the shape (nlat, nlon) = (ceil(3L / 2), 3L) of "
            f"`sphere_grid(L)`; got {rho.shape}."
        )
    if not np.all(np.isfinite(rho)):
        raise ValueError("`rho` must be finite.")
    top = float(rho.max())
    if not top > 0 or float(rho.min()) < -_NEGATIVE_TOL * top:
        raise ValueError(
            f"`rho` must be a nonnegative density (min >= -{_NEGATIVE_TOL:g} max); "
            f"got min {float(rho.min()):.3g}, max {top:.3g}."
        )
    return rho


def sample_sphere(
    key, rho: Float[ArrayLike, "nlat nlon"], n: int, *, safety: float = 1.25
) -> np.ndarray:
    """Draw n tokens on S^2 from the band-limited density with grid values rho.

    The density is the interpolant f = sum_{l < L} a_lm Y_lm of `rho` on the
    grid of `sphere_grid(L)` (the coefficients by `_harmonics.analysis`: the
    function `simulate_sphere` evolves), normalised by its mass sqrt(4 pi) a_00.
    Rejection sampling: proposals uniform on S^2 (normalised Gaussians),
    accepted with probability max(f(x), 0) / B, f(x) by `sphere_values`. The
    bound B is `safety` times the largest grid value; a band-limited function
    can exceed its grid maximum between nodes, so every proposal's value is
    checked against B, and if one exceeds it the draw restarts with B raised to
    `safety` times that value (the samples drawn under too small a bound are
    discarded). The draw is exact once B >= max f, which a bound `safety`
    times a value seen holds in practice (the grid's 3/2-rule nodes miss the
    maximum of a band-limited f by far less than 25 %). Undershoots of f
    below 0 between the nodes (Gibbs) are read as 0. Expected proposals:
    4 pi B n (B ~ max rho).

    Args:
        key: a JAX PRNG key, `jax.random.key(seed)`.
        rho: density values at the nodes of `sphere_grid(L)`, shape (nlat, nlon)
            = (ceil(3L / 2), 3L), e.g. `SphereSolution.rho[i]`: finite and
            nonnegative (values down to -1e-6 of the maximum are accepted as
            rounding); normalised here.
        n: number of tokens, >= 1.
        safety: factor > 1 of the bound over the grid maximum.

    Returns:
        Tokens, shape (n, 3), float64 NumPy, unit norm.

    Raises:
        ValueError: `rho` not of a grid's shape, not finite, or negative
            (below -1e-6 of its maximum); `n` not a positive integer;
            `safety` not > 1.
    """
    rho = _grid_values(rho)
    n = _check_n(n)
    if not float(safety) > 1:
        raise ValueError(f"`safety` must be greater than 1; got {safety!r}.")
    L = rho.shape[1] // 3
    grid = sphere_grid(L)
    with jax.enable_x64(True):
        coeffs = np.asarray(sh.analysis(grid, jnp.asarray(rho)))
        mass = float(np.real(coeffs[0, 0])) * np.sqrt(4 * np.pi)
        if not mass > 0:
            raise ValueError(f"`rho` must have positive mass; got {mass:.3g}.")
        coeffs = jnp.asarray(coeffs / mass)
        bound = float(safety) * float(rho.max()) / mass
        out, count, batch = [], 0, 0
        while count < n:
            kb = jr.fold_in(key, batch)
            batch += 1
            x, u = _proposals(kb, _BATCH)
            f = np.asarray(sphere_values(coeffs, x))
            if f.max() > bound:  # the bound failed: raise it, start again
                bound = float(safety) * float(f.max())
                out, count = [], 0
                continue
            keep = np.asarray(u) * bound < f
            out.append(np.asarray(x)[keep])
            count += int(keep.sum())
    return np.concatenate(out)[:n]


@functools.partial(jax.jit, static_argnums=1)
def _proposals(key, size: int):
    """`size` uniform points on S^2 (size, 3) and uniforms (size,) in float64."""
    kx, ku = jr.split(key)
    g = jr.normal(kx, (size, 3), jnp.float64)
    x = g / jnp.linalg.norm(g, axis=1, keepdims=True)
    return x, jr.uniform(ku, (size,), jnp.float64)
