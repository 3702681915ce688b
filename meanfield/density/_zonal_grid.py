"""The cells of a zonal density on S^{d-1}: volumes, cap fractions and the axis frame.

A zonal density is a function of the angle theta in [0, pi] to an axis e; N cells
uniform in theta, h = pi / N. On S^{d-1} the surface measure of such functions is
|S^{d-2}| sin^{d-2}(theta) d theta ([Zonal densities][math-sphere-zonal]).
"""

import numpy as np
from scipy.special import betainc

from ._funk_hecke import sphere_area

#: Gauss points per cell for the volumes (sin^{d-2} is entire: exact to rounding).
VOLUME_NODES = 16


def gauss_cells(N: int, q: int):
    """Gauss points (N, q) in each cell and weights (q,) summing to h."""
    h = np.pi / N
    x, w = np.polynomial.legendre.leggauss(q)
    points = (np.arange(N)[:, None] + 0.5 * (x[None, :] + 1)) * h
    return points, 0.5 * h * w


def zonal_volumes(N: int, d: int) -> np.ndarray:
    """Volumes V_j = |S^{d-2}| int sin^{d-2} over the cells [j h, (j+1) h), shape (N,).

    They sum to |S^{d-1}| (to rounding); h = pi / N. For d = 2, V_j = 2 h.
    """
    points, w = gauss_cells(N, VOLUME_NODES)
    return sphere_area(d - 1) * (np.sin(points) ** (d - 2)) @ w


def cap_fraction(theta, d: int) -> np.ndarray:
    """Fraction of |S^{d-1}| at angle < theta from the axis, any shape of theta.

    (1/2) I_{sin^2 theta}((d-1)/2, 1/2) for theta <= pi/2 (the regularised
    incomplete beta function), the complement written with cos^2 theta past
    pi/4 (no cancellation near pi/2), and 1 - F(pi - theta) past pi/2.
    """
    theta = np.clip(np.asarray(theta, np.float64), 0, np.pi)
    a = 0.5 * (d - 1)
    t = np.minimum(theta, np.pi - theta)
    low = 0.5 * betainc(a, 0.5, np.sin(t) ** 2)
    high = 0.5 * (1 - betainc(0.5, a, np.cos(t) ** 2))
    half = np.where(t <= np.pi / 4, low, high)
    return np.where(theta <= np.pi / 2, half, 1 - half)


def check_axis(axis, d: int) -> np.ndarray:
    if axis is None:
        return np.eye(d)[0]
    e = np.asarray(axis, np.float64)
    if e.shape != (d,) or not np.all(np.isfinite(e)) or not np.linalg.norm(e) > 0:
        raise ValueError(
            f"`axis` must be a finite nonzero ({d},) vector; got {axis!r}."
        )
    return e / np.linalg.norm(e)


def householder_frame(points: np.ndarray, e: np.ndarray) -> np.ndarray:
    """Points (n, d) with axis e_1 moved to axis e (a Householder reflection)."""
    u = np.eye(e.size)[0] - e
    norm = u @ u
    if norm < 1e-30:
        return points
    return points - np.outer(points @ u, 2 * u / norm)
