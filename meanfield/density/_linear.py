"""Linear stability of the uniform density on the circle, with and without noise.

Linearising d_t rho + d_theta(rho v) = (sigma^2 / 2) d_theta^2 rho at
rho = 1 / (2 pi) (docs/math/density.md), the Fourier mode e^{ik theta} grows at

    lambda_k = k^2 I_k(beta) / (beta I_0(beta)) - sigma^2 k^2 / 2   (softmax),
    lambda_k = k^2 I_k(beta) / beta - sigma^2 k^2 / 2                (unnormalised).

I_k(beta) decreases in k, so lambda_k / k^2 is largest at k = 1: every mode decays
once sigma exceeds sigma_c = sqrt(2 I_1(beta) / (beta I_0(beta))) (softmax).
"""

import numpy as np
from jaxtyping import ArrayLike
from scipy.special import ive

from ._circle import _LOG_MAX, _check_attention, _check_beta, _check_sigma

# The largest beta whose unnormalised sigma_c = sqrt(2 I_1(beta) / beta) is finite.
_BETA_MAX = 1430.7


def growth_rate(
    k, beta: float, attention: str = "softmax", sigma: float = 0.0
) -> np.ndarray:
    """Growth rate of the Fourier mode e^{ik theta} of the uniform density.

    Linearising at rho = 1/(2 pi) (docs/math/density.md):
    lambda_k = k^2 I_k(beta) / (beta I_0(beta)) - sigma^2 k^2 / 2 for softmax,
    k^2 I_k(beta) / beta - sigma^2 k^2 / 2 unnormalised. Without noise every mode
    k >= 1 grows, the fastest near sqrt(2 beta); noise damps the high modes first.

    See [Linear growth of the uniform state][math-density-growth] for the derivation.

    Args:
        k: mode numbers, any shape (e^{-ik theta} grows as e^{ik theta}).
        beta: inverse temperature, > 0.
        attention: "softmax" or "unnormalized".
        sigma: noise of the tokens (d theta = v dt + sigma dW), >= 0.

    Returns:
        lambda_k, shape of `k`; 0 at k = 0 (the mass).

    Raises:
        ValueError: `beta` not positive, `sigma` negative or not finite, unknown
            `attention`.
    """
    k = np.abs(np.asarray(k, np.float64))
    beta = _check_beta(beta)
    _check_attention(attention)
    sigma = _check_sigma(sigma)
    if attention == "softmax":
        drift = k**2 * ive(k, beta) / (beta * ive(0, beta))
    else:
        drift = k**2 * ive(k, beta) * np.exp(beta) / beta
    return drift - 0.5 * sigma**2 * k**2


def fastest_mode(beta: float, attention: str = "softmax", sigma: float = 0.0) -> int:
    """The mode k >= 1 of largest `growth_rate`: the clusters that emerge from noise.

    See [Linear growth of the uniform state][math-density-growth].

    Args:
        beta: inverse temperature, > 0.
        attention: "softmax" or "unnormalized".
        sigma: noise of the tokens, >= 0.

    Returns:
        The maximising k >= 1; 0 when no mode grows (sigma >= `critical_noise`:
        the uniform state is linearly stable and no clusters emerge).

    Raises:
        ValueError: as `growth_rate`.
    """
    beta = _check_beta(beta)
    # The noiseless rate k^2 I_k(beta) peaks near sqrt(2 beta) and decays like
    # e^{-k^2 / (2 beta)} beyond; noise only lowers the maximiser.
    k = np.arange(1, int(4 * np.sqrt(beta)) + 4)
    rates = growth_rate(k, beta, attention, sigma)
    return int(k[np.argmax(rates)]) if rates.max() > 0 else 0


def critical_noise(beta: float | ArrayLike, attention: str = "softmax"):
    """The noise sigma_c above which every mode of the uniform density decays.

    lambda_k / k^2 = I_k(beta) / (beta I_0(beta)) - sigma^2 / 2 is largest at
    k = 1 (I_k(beta) decreases in k), so the uniform state is linearly stable
    exactly when sigma >= sigma_c with

        sigma_c^2 = 2 I_1(beta) / (beta I_0(beta))   (softmax; -> 1 as beta -> 0,
                                                       ~ 2 / beta as beta -> inf),
        sigma_c^2 = 2 I_1(beta) / beta               (unnormalised).

    See [The critical noise][math-density-critical].

    Args:
        beta: inverse temperature(s), > 0, any shape.
        attention: "softmax" or "unnormalized".

    Returns:
        sigma_c, of the shape of `beta` (a NumPy float for a scalar).

    Raises:
        ValueError: a `beta` not positive and finite, unknown `attention`, or
            (unnormalised) sigma_c beyond float64 (beta > 1430.7).
    """
    b = np.asarray(beta, np.float64)
    if b.size == 0 or not np.all(np.isfinite(b) & (b > 0)):
        raise ValueError(f"`beta` must be positive and finite; got {beta}.")
    _check_attention(attention)
    # Scaled Bessel functions, I_k(beta) = ive(k, beta) e^beta: no overflow.
    ratio = 2 * ive(1, b) / b
    if attention == "softmax":
        return np.sqrt(ratio / ive(0, b))[()]
    log_sigma = 0.5 * (np.log(ratio) + b)  # unnormalised: sigma_c^2 = ratio e^beta
    if np.any(log_sigma > _LOG_MAX):
        raise ValueError(
            '`beta` is too large for attention="unnormalized": sigma_c ~ '
            f"e^(beta / 2) is beyond float64 for beta > {_BETA_MAX:.0f}; got {beta}."
        )
    return np.exp(log_sigma)[()]
