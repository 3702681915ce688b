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

from ._bessel import log_i0, rate
from ._circle import (
    _LOG_MAX,
    _check_attention,
    _check_beta,
    _check_representable,
    _check_sigma,
)

# The largest beta whose unnormalised sigma_c = sqrt(2 I_1(beta) / beta) is finite.
_BETA_MAX = 1430.7
# The largest beta of `fastest_mode`: its candidates k <= 4 sqrt(beta) + 4 must be
# integers exact in float64 (below 2^53).
_MODE_BETA_MAX = 1e30


def _check_modes(k) -> np.ndarray:
    """|k| as float64 for integer mode numbers k (any shape); ValueError otherwise."""
    arr = np.asarray(k)
    if arr.dtype.kind not in "iuf":
        raise ValueError(f"`k` must hold integer mode numbers; got {k!r}.")
    bad = ~(np.isfinite(arr) & (arr == np.round(arr)))
    if np.any(bad):
        raise ValueError(
            f"`k` must hold integer mode numbers; got {arr[bad].flat[0]!r}."
        )
    return np.abs(arr.astype(np.float64))


def _check_betas(beta) -> np.ndarray:
    """The inverse temperatures as float64 (any shape, not empty), positive, finite."""
    try:
        b = np.asarray(beta)
        # Booleans, complex numbers, strings (even "2.0", as `real_scalar`), objects.
        if b.dtype.kind not in "iuf":
            raise TypeError
        b = b.astype(np.float64)
    except (TypeError, ValueError) as err:
        raise ValueError(
            f"`beta` must be positive and finite (a number or an array of numbers); "
            f"got {beta!r}."
        ) from err
    if b.size == 0 or not np.all(np.isfinite(b) & (b > 0)):
        raise ValueError(f"`beta` must be positive and finite; got {beta}.")
    return b


def growth_rate(
    k, beta: float | ArrayLike, attention: str = "softmax", sigma: float = 0.0
) -> np.ndarray:
    """Growth rate of the Fourier mode e^{ik theta} of the uniform density.

    Linearising at rho = 1/(2 pi) (docs/math/density.md):
    lambda_k = k^2 I_k(beta) / (beta I_0(beta)) - sigma^2 k^2 / 2 for softmax,
    k^2 I_k(beta) / beta - sigma^2 k^2 / 2 unnormalised. Without noise every mode
    k >= 1 grows, the fastest near sqrt(2 beta); noise damps the high modes first.
    Accurate to rounding at every beta > 0: the Bessel ratio switches to its
    power series below beta = 1e-5 and to Debye's expansion above 1e4.

    See [Linear growth of the uniform state][math-density-growth] and
    [Large and small beta][math-density-bessel].

    Args:
        k: integer mode numbers, any shape (e^{-ik theta} grows as e^{ik theta}).
        beta: inverse temperature, > 0: a number, or an array of them that
            broadcasts with `k` (one rate per pair, as `critical_noise` takes
            arrays of beta).
        attention: "softmax" or "unnormalized".
        sigma: noise of the tokens (d theta = v dt + sigma dW), a number >= 0.

    Returns:
        lambda_k, of the broadcast shape of `k` and `beta` (a NumPy float for
        scalars); 0 at k = 0 (the mass).

    Raises:
        ValueError: `k` not integers, `beta` not positive and finite, `k` and
            `beta` not broadcastable, `sigma` not a finite number >= 0, unknown
            `attention`, unnormalised attention with beta > 709.8 (lambda_k ~
            e^beta beyond float64).
    """
    k = _check_modes(k)
    b = _check_betas(beta)
    _check_attention(attention)
    sigma = _check_sigma(sigma)
    try:
        shape = np.broadcast_shapes(k.shape, b.shape)
    except ValueError as err:
        raise ValueError(
            f"`k` (shape {k.shape}) and `beta` (shape {b.shape}) must broadcast "
            "together."
        ) from err
    if attention != "softmax":
        _check_representable(float(b.max()), attention)
    k, b = np.broadcast_to(k, shape), np.broadcast_to(b, shape)
    per_k2 = rate(np.maximum(k, 1), b)
    # k beyond 1e154: k^2 = inf, its rate is 0 (inf * 0 in the branch not taken).
    with np.errstate(over="ignore", invalid="ignore"):
        k2 = k**2
        # k = 0 is the mass: no growth; a rate that underflows to 0 stays 0.
        drift = np.where((k > 0) & (per_k2 > 0), k2 * per_k2, 0.0)
        damping = 0.5 * np.float64(sigma) ** 2 * k2 if sigma > 0 else 0.0
    if attention != "softmax":
        drift = drift * (ive(0, b) * np.exp(b))  # times I_0(beta): I_k(beta) / beta
    return (drift - damping)[()]


def fastest_mode(beta: float, attention: str = "softmax", sigma: float = 0.0) -> int:
    """The mode k >= 1 of largest `growth_rate`: the clusters that emerge from noise.

    The rate is unimodal in k (its logarithm is concave where it is positive,
    [Large and small beta][math-density-bessel]): found by ternary search over
    1 <= k <= 4 sqrt(beta) + 4, about 1.7 log2(beta) evaluations (75 at
    beta = 1e12), for beta up to 1e30. Up to beta ~ 1e15 the maximiser is
    exact; beyond, the rates within about sqrt(eps beta) modes of it (eps =
    2.2e-16, a relative 1e-8) agree to rounding, and the one returned is among
    them.
    See [Linear growth of the uniform state][math-density-growth].

    Args:
        beta: inverse temperature, > 0 and <= 1e30.
        attention: "softmax" or "unnormalized".
        sigma: noise of the tokens, a number >= 0.

    Returns:
        The maximising k >= 1; 0 when no mode grows (sigma >= `critical_noise`:
        the uniform state is linearly stable and no clusters emerge).

    Raises:
        ValueError: as `growth_rate` (for a scalar beta), or beta > 1e30.
    """
    beta = _check_beta(beta)
    if beta > _MODE_BETA_MAX:
        raise ValueError(
            f"`beta` must be at most {_MODE_BETA_MAX:g} in `fastest_mode` (its modes, "
            f"near sqrt(2 beta), must be exact integers in float64); got {beta}."
        )
    _check_attention(attention)
    sigma = _check_sigma(sigma)
    # lambda_k / scale = k^2 (I_k / (beta I_0) - damping), scale = 1 (softmax)
    # or I_0(beta) (unnormalised, beyond float64 past beta ~ 710): the maximiser
    # is that of the scaled rates.
    if sigma == 0:
        damping = 0.0
    elif attention == "softmax":
        with np.errstate(over="ignore"):  # sigma > 1e154: inf, nothing grows
            damping = 0.5 * np.float64(sigma) ** 2
    else:  # sigma^2 / (2 I_0(beta)), in logarithms
        with np.errstate(over="ignore"):
            damping = float(np.exp(2 * np.log(sigma) - np.log(2) - log_i0(beta)))

    def rates(k):
        k = np.asarray(k, np.float64)
        return k**2 * (rate(k, beta) - damping)

    # I_k decreases in k, so lambda_k > 0 exactly for k below some K: none
    # grows when lambda_1 <= 0.
    if not rates([1.0])[0] > 0:
        return 0
    # The noiseless rate k^2 I_k(beta) peaks near sqrt(2 beta) and decays like
    # e^{-k^2 / (2 beta)} beyond; noise only lowers the maximiser. Ternary
    # search, which compares rates a third of the interval apart: where the
    # rates of neighbours agree to rounding (beta > 1e15) those of distant
    # modes still differ, and it ends among the modes of the largest rate.
    low, high = 1, int(4 * np.sqrt(beta)) + 4
    while high - low > 2:
        third = (high - low) // 3
        left, right = rates([low + third, high - third])
        if left < right:  # the maximiser is past low + third
            low += third + 1
        else:  # ... or before high - third (the first, of two equal)
            high -= third + 1
    candidates = np.arange(low, high + 1)
    return int(candidates[np.argmax(rates(candidates))])


def critical_noise(beta: float | ArrayLike, attention: str = "softmax"):
    """The noise sigma_c above which every mode of the uniform density decays.

    lambda_k / k^2 = I_k(beta) / (beta I_0(beta)) - sigma^2 / 2 is largest at
    k = 1 (I_k(beta) decreases in k), so the uniform state is linearly stable
    exactly when sigma >= sigma_c with

        sigma_c^2 = 2 I_1(beta) / (beta I_0(beta))   (softmax; -> 1 as beta -> 0,
                                                       ~ 2 / beta as beta -> inf),
        sigma_c^2 = 2 I_1(beta) / beta               (unnormalised).

    Softmax: accurate to rounding at every beta > 0, subnormal or up to float64's
    largest ([Large and small beta][math-density-bessel]).
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
    b = _check_betas(beta)
    _check_attention(attention)
    per_k2 = rate(1.0, b)  # I_1(beta) / (beta I_0(beta))
    if attention == "softmax":
        return np.sqrt(2 * per_k2)[()]
    # Unnormalised: sigma_c^2 = 2 per_k2 I_0(beta), in logarithms.
    log_sigma = 0.5 * (np.log(2 * per_k2) + log_i0(b))
    if np.any(log_sigma > _LOG_MAX):
        raise ValueError(
            '`beta` is too large for attention="unnormalized": sigma_c ~ '
            f"e^(beta / 2) is beyond float64 for beta > {_BETA_MAX:.0f}; got {beta}."
        )
    return np.exp(log_sigma)[()]
