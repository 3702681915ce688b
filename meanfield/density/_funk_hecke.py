"""Zonal functions on S^{d-1}: Legendre polynomials in d dimensions and Funk-Hecke.

A function of <x, e> on the sphere S^{d-1} (d >= 2) expands in the Legendre
polynomials of dimension d, P_l(t) = C_l^{(d-2)/2}(t) / C_l^{(d-2)/2}(1)
(Gegenbauer polynomials normalised to P_l(1) = 1; Chebyshev's T_l for d = 2,
Legendre's for d = 3). By the Funk-Hecke theorem a zonal kernel K(<x, y>)
acts on them diagonally,

    int_{S^{d-1}} K(<x, y>) P_l(<y, e>) dy = kappa_l P_l(<x, e>),
    kappa_l = |S^{d-2}| int_{-1}^{1} K(t) P_l(t) (1 - t^2)^{(d-3)/2} dt,

and for the attention kernel K(t) = e^{beta t}

    kappa_l = (2 pi)^{d/2} beta^{1 - d/2} I_{l + d/2 - 1}(beta)

(2 pi I_l(beta) on the circle). See [The sphere S^{d-1}][math-sphere-funk-hecke].
"""

import numpy as np
from scipy.special import gammaln, ive


def sphere_area(d: int) -> float:
    """|S^{d-1}| = 2 pi^{d/2} / Gamma(d/2), the area of the unit sphere in R^d."""
    return float(2 * np.exp(0.5 * d * np.log(np.pi) - gammaln(0.5 * d)))


def harmonic_dimension(ell, d: int) -> np.ndarray:
    """The dimension of the degree-l spherical harmonics on S^{d-1}, any shape of l.

    N(d, l) = (2l + d - 2) (l + d - 3)! / (l! (d - 2)!) (1 at l = 0; 2 for l >= 1
    on the circle, 2l + 1 on S^2).
    """
    ell = np.asarray(ell, np.float64)
    if d == 2:
        return np.where(ell == 0, 1.0, 2.0)
    log = gammaln(ell + d - 2) - gammaln(ell + 1) - gammaln(d - 1)
    return (2 * ell + d - 2) * np.exp(log)


def legendre(L: int, t, d: int) -> np.ndarray:
    """P_0..P_{L-1} of dimension d at the points t: shape (L,) + t.shape.

    The three-term recurrence (l + d - 2) P_{l+1} = (2l + d - 2) t P_l - l P_{l-1},
    stable on [-1, 1] (|P_l| <= 1 there).
    """
    t = np.asarray(t, np.float64)
    out = np.empty((L,) + t.shape)
    out[0] = 1.0
    if L > 1:
        out[1] = t
    for ell in range(1, L - 1):
        out[ell + 1] = ((2 * ell + d - 2) * t * out[ell] - ell * out[ell - 1]) / (
            ell + d - 2
        )
    return out


def scaled_funk_hecke(ell, beta: float, d: int) -> np.ndarray:
    """e^{-beta} kappa_l for K(t) = e^{beta t} on S^{d-1}: any shape of integers l >= 0.

    kappa_l = (2 pi)^{d/2} beta^{1 - d/2} I_{l + d/2 - 1}(beta), scaled by
    e^{-beta} against overflow (SciPy's `ive`); 0 where I underflows.
    """
    ell = np.asarray(ell, np.float64)
    log_front = 0.5 * d * np.log(2 * np.pi) + (1 - 0.5 * d) * np.log(beta)
    return np.exp(log_front) * ive(ell + 0.5 * d - 1, beta)
