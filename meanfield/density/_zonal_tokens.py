"""Tokens and zonal densities on S^{d-1}: sampling, angles to the axis, and W1.

The cross-check of `simulate_zonal` against particles: draw tokens from a zonal
density, run them with `mf.simulate`, and compare the distribution of their
angles to the axis with the density's ([Zonal densities][math-sphere-zonal]).
"""

import jax
import jax.numpy as jnp
import jax.random as jr
import numpy as np
from jaxtyping import ArrayLike, Float

from ._linear import check_dimension
from ._zonal_grid import cap_fraction, check_axis, householder_frame, zonal_volumes


def _cell_masses(rho, d: int, name: str = "rho") -> np.ndarray:
    rho = np.asarray(rho, np.float64)
    if rho.ndim != 1 or rho.size < 1 or not np.all(np.isfinite(rho)):
        raise ValueError(
            f"`{name}` must be a finite (N,) array; got shape {rho.shape}."
        )
    mass = np.maximum(rho, 0) * zonal_volumes(rho.size, d)
    if not mass.sum() > 0:
        raise ValueError(f"`{name}` must have positive mass.")
    return mass / mass.sum()


def _angle_in_cells(cells, u, N: int, d: int) -> np.ndarray:
    """Angles in the cells `cells` at cap-fraction fractions u of them (bisection)."""
    lo, hi = cells * (np.pi / N), (cells + 1) * (np.pi / N)
    f_lo, f_hi = cap_fraction(lo, d), cap_fraction(hi, d)
    target = f_lo + u * (f_hi - f_lo)
    for _ in range(60):  # the cell's width halves each time: 60 reach rounding
        mid = 0.5 * (lo + hi)
        below = cap_fraction(mid, d) < target
        lo, hi = np.where(below, mid, lo), np.where(below, hi, mid)
    return 0.5 * (lo + hi)


def sample_zonal(
    key, rho: Float[ArrayLike, " N"], n: int, d: int, axis=None
) -> np.ndarray:
    """Draw n tokens on S^{d-1} from a piecewise-constant zonal density.

    A cell by its mass V_j rho_j, theta in it by the inverse CDF of
    sin^{d-2} (`cap_fraction`), and the direction around the axis uniform on
    S^{d-2} (a normalised Gaussian in R^{d-1}; a random sign for d = 2).

    Args:
        key: a JAX PRNG key, `jax.random.key(seed)`.
        rho: cell values, shape (N,) (normalised here; negatives read as 0).
        n: number of tokens, >= 1.
        d: dimension, an integer >= 2.
        axis: the symmetry axis, shape (d,); None: e_1.

    Returns:
        Tokens, shape (n, d), float64 NumPy, unit norm.

    Raises:
        ValueError: bad `rho`, `n`, `d` or `axis`.
    """
    d = check_dimension(d)
    if isinstance(n, bool) or int(n) != n or n < 1:
        raise ValueError(f"`n` must be a positive integer; got {n!r}.")
    n = int(n)
    p = _cell_masses(rho, d)
    e = check_axis(axis, d)
    kc, ku, kd = jr.split(key, 3)
    with jax.enable_x64(True):
        cells = np.asarray(jr.choice(kc, p.size, (n,), p=jnp.asarray(p)))
        u = np.asarray(jr.uniform(ku, (n,), jnp.float64))
        g = np.asarray(jr.normal(kd, (n, d - 1), jnp.float64))
    theta = _angle_in_cells(cells, u, p.size, d)
    g = g / np.linalg.norm(g, axis=1, keepdims=True)
    x = np.concatenate([np.cos(theta)[:, None], np.sin(theta)[:, None] * g], 1)
    return householder_frame(x, e)


def zonal_angles(x: Float[ArrayLike, "n d"], axis=None) -> np.ndarray:
    """Angles theta in [0, pi] (n,) of tokens x (n, d) to the axis (None: e_1)."""
    x = np.asarray(x, np.float64)
    if x.ndim != 2 or x.shape[1] < 2:
        raise ValueError(f"`x` must have shape (n, d), d >= 2; got {x.shape}.")
    e = check_axis(axis, x.shape[1])
    c = (x @ e) / np.linalg.norm(x, axis=1)
    s = np.linalg.norm(x - np.outer(x @ e, e), axis=1) / np.linalg.norm(x, axis=1)
    return np.arctan2(s, c)  # accurate at both poles, unlike arccos


def zonal_w1(
    rho: Float[ArrayLike, " N"],
    thetas: Float[ArrayLike, " n"],
    d: int,
    weights: Float[ArrayLike, " n"] | None = None,
) -> float:
    """W1 between a zonal density's theta-marginal and tokens' angles, on [0, pi].

    W1 = int_0^pi |F(theta) - F_n(theta)| dtheta, F the density's exact CDF
    (piecewise sin^{d-2} within the cells), F_n the tokens' step function. On
    each interval between consecutive faces and tokens F_n is constant and F
    monotone: the crossing F = F_n is found by bisection and each part
    integrated by 10-point Gauss-Legendre (F is smooth there): exact to ~1e-14.

    Args:
        rho: cell values, shape (N,) (normalised here).
        thetas: token angles in [0, pi], shape (n,) (`zonal_angles`).
        d: dimension, an integer >= 2.
        weights: token masses, shape (n,), nonnegative; None: uniform.

    Returns:
        The distance, in radians.

    Raises:
        ValueError: bad `rho`, `thetas`, `weights` or `d`.
    """
    d = check_dimension(d)
    p = _cell_masses(rho, d)
    N = p.size
    th = np.asarray(thetas, np.float64)
    if th.ndim != 1 or th.size == 0 or not np.all((th >= 0) & (th <= np.pi)):
        raise ValueError("`thetas` must be an (n,) array of angles in [0, pi].")
    w = np.full(th.size, 1 / th.size) if weights is None else np.asarray(weights, float)
    if w.shape != th.shape or np.any(w < 0) or not w.sum() > 0:
        raise ValueError(f"`weights` must be nonnegative with shape {th.shape}.")
    order = np.argsort(th)
    th, steps = th[order], np.concatenate([[0.0], np.cumsum(w[order] / w.sum())])
    edges = np.arange(N + 1) * (np.pi / N)
    cum = np.concatenate([[0.0], np.cumsum(p)])
    f_edges = cap_fraction(edges, d)

    def F(x, cell):
        inside = (cap_fraction(x, d) - f_edges[cell]) / (
            f_edges[cell + 1] - f_edges[cell]
        )
        return cum[cell] + p[cell] * np.clip(inside, 0, 1)

    b = np.unique(np.concatenate([edges, th]))
    a, z = b[:-1], b[1:]
    cell = np.clip(np.searchsorted(edges, 0.5 * (a + z), side="right") - 1, 0, N - 1)
    c = steps[np.searchsorted(th, a, side="right")]
    fa, fz = F(a, cell) - c, F(z, cell) - c
    lo, hi = a.copy(), z.copy()
    cross = fa * fz < 0
    for _ in range(60):
        mid = 0.5 * (lo + hi)
        pos = F(mid, cell) - c > 0
        lo, hi = np.where(pos, lo, mid), np.where(pos, mid, hi)
    m = np.where(cross, 0.5 * (lo + hi), z)
    x, gw = np.polynomial.legendre.leggauss(10)
    total = 0.0
    for s, t in ((a, m), (m, z)):
        pts = s[:, None] + 0.5 * (x[None, :] + 1) * (t - s)[:, None]
        vals = F(pts, cell[:, None]) - c[:, None]
        total += np.sum(np.abs(vals @ gw) * 0.5 * (t - s))
    return float(total)
