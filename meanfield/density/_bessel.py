"""Ratios of the modified Bessel functions I_k(beta) at every beta > 0.

The kernel e^{beta cos psi} has the Fourier coefficients I_k(beta), and the
linear analysis of the uniform density needs gamma_k = I_k(beta) / I_0(beta) and
I_k(beta) / (beta I_0(beta)) (docs/math/density.md). SciPy's scaled `ive`
(e^{-beta} I_k(beta)) gives them for _SMALL_BETA <= beta <= _LARGE_BETA. Above,
it returns NaN past beta ~ 2e9 and loses digits in the tail k ~ 4 sqrt(beta)
(1e-11 at beta = 1e9): Debye's uniform expansion takes over, accurate to 1e-16
for beta >= 1e4 and every k. Below, I_1(beta) / beta ~ 1/2 loses every digit
once beta / 2 is subnormal: the power series takes over.
See [Large and small beta][math-density-bessel].
"""

import numpy as np
from scipy.special import gammaln, ive

# Below: the power series (its first omitted term is below 1e-32 relative).
_SMALL_BETA = 1e-5
# Above: Debye's expansion (its first omitted term is below 0.113 / beta^4).
_LARGE_BETA = 1e4
# SciPy's ive returns NaN for orders past ~1e9; beyond this order the ratio is 0.
_K_MAX = 1e6


def _series(k, beta):
    """The tail s of the power series: I_k(beta) = (beta / 2)^k / k! (1 + s).

    s = sum_{j >= 1} (beta^2 / 4)^j k! / (j! (k + j)!), kept to j = 2.
    """
    x = beta * beta / 4
    return x / (k + 1) * (1 + x / (2 * (k + 2)))


def _debye_sum(k, beta):
    """S - 1 with e^{-beta} I_k(beta) = e^{E} (2 pi)^{-1/2} (k^2 + beta^2)^{-1/4} S.

    Debye's series sum_j U_j(p) / k^j with p = k / sqrt(k^2 + beta^2) (DLMF
    10.41.10), each term written in t = 1 / sqrt(k^2 + beta^2) = p / k so that
    k = 0 (Hankel's expansion) is included: U_j(p) / k^j = t^j P_j(p^2).
    """
    t = 1 / np.hypot(k, beta)
    p2 = (k * t) ** 2
    u1 = (3 - 5 * p2) / 24
    u2 = (81 + p2 * (-462 + 385 * p2)) / 1152
    u3 = (30375 + p2 * (-369603 + p2 * (765765 - 425425 * p2))) / 414720
    return t * (u1 + t * (u2 + t * u3))


def _debye_log_ratio(k, beta):
    """log(I_k(beta) / I_0(beta)) by Debye's uniform expansion.

    The exponent E = sqrt(k^2 + beta^2) - beta - k asinh(k / beta) (0 at k = 0)
    is written without cancellation or overflow: with x = k / beta,
    sqrt(k^2 + beta^2) - beta = k x / (sqrt(1 + x^2) + 1).
    """
    ratio = k / beta
    exponent = k * (ratio / (np.hypot(ratio, 1) + 1)) - k * np.arcsinh(ratio)
    with np.errstate(over="ignore"):  # k > 1e154 beta: log1p(inf) = inf, I_k = 0
        spread = -0.25 * np.log1p(ratio * ratio)
    return (
        exponent
        + spread
        + np.log1p(_debye_sum(k, beta))
        - np.log1p(_debye_sum(np.zeros_like(k), beta))
    )


def _by_regime(k, beta, small, middle, large) -> np.ndarray:
    """Evaluate small / middle / large (functions of (k, beta)) where each holds."""
    k, beta = np.broadcast_arrays(np.asarray(k, np.float64), np.asarray(beta))
    out = np.empty(k.shape)
    low, high = beta < _SMALL_BETA, beta > _LARGE_BETA
    for where, f in ((low, small), (~(low | high), middle), (high, large)):
        if np.any(where):
            out[where] = f(k[where], beta[where])
    return out


def _ive(k, beta):
    """SciPy's e^{-beta} I_k(beta), 0 (not NaN) for k > _K_MAX, where I_k underflows.

    For beta <= _LARGE_BETA and k > _K_MAX, I_k(beta) / I_0(beta) is below
    (e beta / 2k)^k < 0.02^k: 0 in float64.
    """
    return np.where(k > _K_MAX, 0.0, ive(np.minimum(k, _K_MAX), beta))


def rate(k, beta, nu: float = 0.0) -> np.ndarray:
    """I_{k+nu}(beta) / (beta I_nu(beta)) for integers k >= 1, beta > 0 (broadcast).

    The softmax growth rate per l(l + d - 2) on S^{d-1}, nu = d/2 - 1
    (docs/math/density.md, docs/math/sphere.md): 1/2 at k = 1, nu = 0 as
    beta -> 0 (also for subnormal beta), 1 / beta as beta -> inf.
    """
    return _by_regime(
        k,
        beta,
        # (beta/2)^k Gamma(nu+1) / (beta Gamma(k+nu+1)): exact 1/2 at k = 1, nu = 0.
        lambda k, b: (
            np.power(b / 2, k - 1)
            * np.exp(gammaln(nu + 1) - gammaln(k + nu + 1))
            / 2
            * ((1 + _series(k + nu, b)) / (1 + _series(nu + 0.0, b)))
        ),
        lambda k, b: _ive(k + nu, b) / (b * ive(nu, b)),
        lambda k, b: np.exp(_debye_log_ratio(k + nu, b) - _debye_log_ratio(nu, b)) / b,
    )


def neighbour_ratios(beta: float, nu: float = 0.0) -> tuple[float, float, float]:
    """(1 - gamma_1, q, 1 - q) with gamma_1 = I_{nu+1} / I_nu, q = I_{nu+2} / I_{nu+1}.

    At beta, for a scalar beta > 0 and order nu >= 0 (nu = d/2 - 1 on S^{d-1}). Above
    _LARGE_BETA gamma_1 and q are 1 - O(1 / beta): the differences come from
    Debye's logarithms (expm1), exact to rounding, not from differences of
    numbers near 1 (relative errors ~ eps beta).
    """
    if beta > _LARGE_BETA:
        log_i = _debye_log_ratio(np.array([nu, nu + 1.0, nu + 2.0]), beta)
        log_gamma1, log_q = log_i[1] - log_i[0], log_i[2] - log_i[1]
        return (
            float(-np.expm1(log_gamma1)),
            float(np.exp(log_q)),
            float(-np.expm1(log_q)),
        )
    if beta < _SMALL_BETA:
        # I_{k+1} / I_k = beta / (2 (k + 1)) (1 + s_{k+1}) / (1 + s_k).
        s0, s1, s2 = (_series(nu + k, beta) for k in range(3))
        gamma1 = beta / (2 * (nu + 1)) * ((1 + s1) / (1 + s0))
        q = beta / (2 * (nu + 2)) * ((1 + s2) / (1 + s1))
    else:
        gamma1 = float(ive(nu + 1, beta) / ive(nu, beta))
        q = float(ive(nu + 2, beta) / ive(nu + 1, beta))
    return 1 - gamma1, q, 1 - q


def _debye_log_ive0(beta):
    """log(e^{-beta} I_0(beta)) by Hankel's expansion (Debye's at k = 0)."""
    return -0.5 * (np.log(2 * np.pi) + np.log(beta)) + np.log1p(
        _debye_sum(np.zeros_like(beta), beta)
    )


def log_i0(beta) -> np.ndarray:
    """The logarithm of I_0(beta), beta > 0 (any shape): finite past its overflow."""
    return log_iv(0.0, beta)


def log_iv(nu: float, beta) -> np.ndarray:
    """The logarithm of I_nu(beta), order nu >= 0, beta > 0 (any shape).

    Finite past the overflow of I_nu (beta > 709.8) and, for nu > 0, past its
    underflow at subnormal beta (the power series (beta/2)^nu / Gamma(nu + 1)).
    """

    def series(k, b):
        # log(b) - log(2), not log(b / 2): b / 2 underflows at the least subnormal.
        return k * (np.log(b) - np.log(2)) - gammaln(k + 1) + np.log1p(_series(k, b))

    def scaled(k, b):
        return b + np.log(ive(k, b))

    def debye(k, b):
        return b + _debye_log_ive0(b) + _debye_log_ratio(k, b)

    return _by_regime(nu, beta, series, scaled, debye)


def scaled_bessel(k, beta: float) -> np.ndarray:
    """e^{-beta} I_k(beta) for integers k >= 0 (array) and one beta > 0.

    SciPy's `ive` up to _LARGE_BETA; above, Debye's expansion (SciPy returns
    NaN past beta ~ 2e9): e^{-beta} I_0(beta) times I_k / I_0, each finite.
    """
    k = np.asarray(k, np.float64)
    if beta <= _LARGE_BETA:
        return _ive(k, beta)
    return np.exp(_debye_log_ive0(beta) + _debye_log_ratio(k, beta))
