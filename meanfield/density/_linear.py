"""Linear stability of the uniform density on S^{d-1}, with and without noise.

Linearising d_t rho + div(rho v) = (sigma^2 / 2) Delta rho at the uniform density
1 / |S^{d-1}|, the Funk-Hecke theorem (docs/math/sphere.md) makes every spherical
harmonic of degree l an eigenfunction, growing at (nu = d/2 - 1)

    lambda_l = l (l + d - 2) [I_{l+nu}(beta) / (beta I_nu(beta)) - sigma^2 / 2]
                                                              (softmax),
    lambda_l = l (l + d - 2) [Gamma(d/2) (2/beta)^nu I_{l+nu}(beta) / beta
                              - sigma^2 / 2]                  (unnormalised).

On the circle (d = 2, the Fourier mode e^{ik theta}): k^2 I_k(beta) / (beta
I_0(beta)) - sigma^2 k^2 / 2 and k^2 I_k(beta) / beta - sigma^2 k^2 / 2.
I_{l+nu}(beta) decreases in l, so lambda_l / (l (l + d - 2)) is largest at
l = 1: every degree decays once sigma exceeds sigma_c (`critical_noise`).
"""

import numpy as np
from jaxtyping import ArrayLike
from scipy.special import gammaln

from ._bessel import log_iv, rate
from ._circle import (
    LOG_MAX,
    check_attention,
    check_beta,
    check_representable,
    check_sigma,
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


def check_dimension(d) -> int:
    """The dimension d of R^d (tokens on S^{d-1}): an integer >= 2."""
    if isinstance(d, bool | np.bool_) or not isinstance(d, int | np.integer) or d < 2:
        raise ValueError(
            f"`d` must be an integer >= 2 (tokens on S^(d-1) in R^d); got {d!r}."
        )
    return int(d)


def _log_unnormalized_scale(beta, d: int):
    """The log of Gamma(d/2) (2/beta)^nu I_nu(beta), nu = d/2 - 1 (log I_0 if d = 2).

    The unnormalised rate per l (l + d - 2) is this times the softmax one.
    """
    nu = 0.5 * d - 1
    return gammaln(0.5 * d) + nu * (np.log(2) - np.log(beta)) + log_iv(nu, beta)


def growth_rate(
    k,
    beta: float | ArrayLike,
    attention: str = "softmax",
    sigma: float = 0.0,
    d: int = 2,
) -> np.ndarray:
    """Growth rate of the degree-k spherical harmonics of the uniform density.

    Linearising at the uniform density on S^{d-1} (docs/math/sphere.md), with
    nu = d/2 - 1: lambda_k = k (k + d - 2) [I_{k+nu}(beta) / (beta I_nu(beta))
    - sigma^2 / 2] for softmax, k (k + d - 2) [Gamma(d/2) (2/beta)^nu
    I_{k+nu}(beta) / beta - sigma^2 / 2] unnormalised. On the circle (d = 2)
    the degree-k harmonics are the Fourier modes e^{+-ik theta}, with
    lambda_k = k^2 I_k(beta) / (beta I_0(beta)) - sigma^2 k^2 / 2 (softmax) and
    k^2 I_k(beta) / beta - sigma^2 k^2 / 2 (unnormalised). Without noise every
    degree k >= 1 grows, the fastest near sqrt(2 beta); noise damps the high
    degrees first. Accurate to rounding at every beta > 0: the Bessel ratio
    switches to its power series below beta = 1e-5 and to Debye's expansion
    above 1e4.

    See [Linear growth of the uniform state][math-density-growth],
    [Large and small beta][math-density-bessel] and
    [The linear theory on the sphere][math-sphere-growth].

    Args:
        k: integer degrees (mode numbers), any shape (|k| is used).
        beta: inverse temperature, > 0: a number, or an array of them that
            broadcasts with `k` (one rate per pair, as `critical_noise` takes
            arrays of beta).
        attention: "softmax" or "unnormalized".
        sigma: noise of the tokens (dx = v dt + sigma dW on the sphere), a
            number >= 0.
        d: the dimension of the tokens, an integer >= 2 (tokens on S^{d-1}).

    Returns:
        lambda_k, of the broadcast shape of `k` and `beta` (a NumPy float for
        scalars); 0 at k = 0 (the mass).

    Raises:
        ValueError: `k` not integers, `beta` not positive and finite, `k` and
            `beta` not broadcastable, `sigma` not a finite number >= 0, unknown
            `attention`, `d` not an integer >= 2, unnormalised attention with
            beta > 709.8 (lambda_k ~ e^beta beyond float64).
    """
    k = _check_modes(k)
    b = _check_betas(beta)
    check_attention(attention)
    sigma = check_sigma(sigma)
    d = check_dimension(d)
    try:
        shape = np.broadcast_shapes(k.shape, b.shape)
    except ValueError as err:
        raise ValueError(
            f"`k` (shape {k.shape}) and `beta` (shape {b.shape}) must broadcast "
            "together."
        ) from err
    if attention != "softmax":
        check_representable(float(b.max()), attention)
    k, b = np.broadcast_to(k, shape), np.broadcast_to(b, shape)
    per_eigenvalue = rate(np.maximum(k, 1), b, 0.5 * d - 1)
    # k beyond 1e154: k^2 = inf, its rate is 0 (inf * 0 in the branch not taken).
    with np.errstate(over="ignore", invalid="ignore"):
        eigenvalue = k * (k + (d - 2))  # -Laplacian's eigenvalue at degree k
        # k = 0 is the mass: no growth; a rate that underflows to 0 stays 0.
        drift = np.where(
            (k > 0) & (per_eigenvalue > 0), eigenvalue * per_eigenvalue, 0.0
        )
        damping = 0.5 * np.float64(sigma) ** 2 * eigenvalue if sigma > 0 else 0.0
    if attention != "softmax":
        drift = drift * np.exp(_log_unnormalized_scale(b, d))
    return (drift - damping)[()]


def fastest_mode(
    beta: float, attention: str = "softmax", sigma: float = 0.0, d: int = 2
) -> int:
    """The degree k >= 1 of largest `growth_rate`: the clusters that emerge from noise.

    On the circle the number of clusters; on S^{d-1} the degree of the
    spherical harmonics that grow fastest, which sets the pattern of the
    clusters (Bruno, Pasqualotto & Agazzi's index maximising the rescaled
    Gegenbauer coefficients of e^{beta t}). The rate is unimodal in k (its
    logarithm is concave where it is positive,
    [Large and small beta][math-density-bessel]): found by ternary search over
    1 <= k <= 4 sqrt(beta) + 4, about 1.7 log2(beta) evaluations (75 at
    beta = 1e12), for beta up to 1e30. Up to beta ~ 1e15 the maximiser is
    exact; beyond, the rates within about sqrt(eps beta) modes of it (eps =
    2.2e-16, a relative 1e-8) agree to rounding, and the one returned is among
    them.
    See [Linear growth of the uniform state][math-density-growth] and
    [The linear theory on the sphere][math-sphere-growth].

    Args:
        beta: inverse temperature, > 0 and <= 1e30.
        attention: "softmax" or "unnormalized".
        sigma: noise of the tokens, a number >= 0.
        d: the dimension of the tokens, an integer >= 2 (tokens on S^{d-1}).

    Returns:
        The maximising k >= 1; 0 when no mode grows (sigma >= `critical_noise`:
        the uniform state is linearly stable and no clusters emerge).

    Raises:
        ValueError: as `growth_rate` (for a scalar beta), or beta > 1e30.
    """
    beta = check_beta(beta)
    if beta > _MODE_BETA_MAX:
        raise ValueError(
            f"`beta` must be at most {_MODE_BETA_MAX:g} in `fastest_mode` (its modes, "
            f"near sqrt(2 beta), must be exact integers in float64); got {beta}."
        )
    check_attention(attention)
    sigma = check_sigma(sigma)
    d = check_dimension(d)
    nu = 0.5 * d - 1
    # lambda_k / scale = k (k + d - 2) (rate - damping), scale = 1 (softmax) or
    # Gamma(d/2) (2/beta)^nu I_nu(beta) (unnormalised, beyond float64 past
    # beta ~ 710): the maximiser is that of the scaled rates.
    if sigma == 0:
        damping = 0.0
    elif attention == "softmax":
        with np.errstate(over="ignore"):  # sigma > 1e154: inf, nothing grows
            damping = 0.5 * np.float64(sigma) ** 2
    else:  # sigma^2 / (2 scale), in logarithms
        with np.errstate(over="ignore"):
            damping = float(
                np.exp(2 * np.log(sigma) - np.log(2) - _log_unnormalized_scale(beta, d))
            )

    def rates(k):
        k = np.asarray(k, np.float64)
        return k * (k + (d - 2)) * (rate(k, beta, nu) - damping)

    # I_{k+nu} decreases in k, so lambda_k > 0 exactly for k below some K: none
    # grows when lambda_1 <= 0.
    if not rates([1.0])[0] > 0:
        return 0
    # The noiseless rate peaks where k (k + d - 2) ~ 2 beta and decays like
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


def critical_noise(
    beta: float | ArrayLike, attention: str = "softmax", d: int = 2
) -> np.ndarray:
    """The noise sigma_c above which every degree of the uniform density decays.

    lambda_k / (k (k + d - 2)) is largest at k = 1 (I_{k+nu}(beta) decreases in
    k), so the uniform state on S^{d-1} is linearly stable exactly when
    sigma >= sigma_c, with nu = d/2 - 1 and

        sigma_c^2 = 2 I_{d/2}(beta) / (beta I_{d/2-1}(beta))      (softmax),
        sigma_c^2 = Gamma(d/2) (2/beta)^{d/2} I_{d/2}(beta)       (unnormalised).

    On the circle: 2 I_1(beta) / (beta I_0(beta)) (-> 1 as beta -> 0, ~ 2 / beta
    as beta -> inf) and 2 I_1(beta) / beta. For unnormalised attention 1 /
    sigma_c^2 is Mun & Rosenzweig's linear-stability threshold K_#^{(d)}(beta)
    = beta^{d/2} / (2^{d/2} Gamma(d/2) I_{d/2}(beta)) of the coupling K = 1 /
    sigma^2. Softmax: accurate to rounding at every beta > 0, subnormal or up
    to float64's largest ([Large and small beta][math-density-bessel]).
    See [The critical noise][math-density-critical] and
    [The linear theory on the sphere][math-sphere-growth].

    Args:
        beta: inverse temperature(s), > 0, any shape.
        attention: "softmax" or "unnormalized".
        d: the dimension of the tokens, an integer >= 2 (tokens on S^{d-1}).

    Returns:
        sigma_c, of the shape of `beta` (a NumPy float for a scalar).

    Raises:
        ValueError: a `beta` not positive and finite, unknown `attention`,
            `d` not an integer >= 2, or (unnormalised) sigma_c beyond float64
            (beta > 1430.7 on the circle).
    """
    b = _check_betas(beta)
    check_attention(attention)
    d = check_dimension(d)
    per_eigenvalue = rate(1.0, b, 0.5 * d - 1)  # I_{d/2}(beta) / (beta I_{d/2-1})
    if attention == "softmax":
        return np.sqrt(2 * per_eigenvalue)[()]
    # Unnormalised: sigma_c^2 = 2 per_eigenvalue scale, in logarithms.
    log_sigma = 0.5 * (np.log(2 * per_eigenvalue) + _log_unnormalized_scale(b, d))
    if np.any(log_sigma > LOG_MAX):
        raise ValueError(
            '`beta` is too large for attention="unnormalized": sigma_c ~ '
            f"e^(beta / 2) is beyond float64 (beta > {_BETA_MAX:.0f} on the "
            f"circle); got {beta}."
        )
    return np.exp(log_sigma)[()]
