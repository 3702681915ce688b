"""Two tokens under a common matrix noise: the probability of ending antipodal.

Fedorov, Sander, Elie, Marion & Lauriere ("Clustering in deep stochastic
Transformers", 2026; arXiv 2601.21942) take the value matrices of a deep
Transformer random, as at initialisation, with residual scale 1/sqrt(L). As the
depth L grows the tokens follow, on the unit sphere, an SDE driven by one matrix
Brownian motion B shared by all tokens, and for two tokens antipodal
configurations attract with positive probability past a threshold in the
interaction strength beta and the dimension d. Two models, both with
B = W / sqrt(d) (entries of variance t / d, as `mf.CommonNoise`):

    "values"  dx_i = sigma P_i dB y_i - sigma^2 (d - 1) / (2 d) |y_i|^2 x_i dt
              (Ito; the noise is the value matrix, y_i = sum_j P_ij x_j the
              attention average; no drift: the values are centred)
    "tokens"  dx_i = P_i (Gamma(x_i) dt + sigma o dB x_i)
              (Stratonovich; `mf.simulate(..., noise=mf.CommonNoise(sigma))`
              with A = beta I, V = I, normalization="sphere")

P_i = I - x_i x_i^T. In both, rho = <x_1, x_2> is a one-dimensional diffusion
d rho = b dt + sqrt(a) dW on [-1, 1] with 2 b / a = (g(rho) - rho) / (1 - rho^2),
g >= 0 (docs/math/common-noise.md):

    values:  g = (d - 2) / cosh(beta (1 - rho))
    tokens:  g = 2 d q(rho) / sigma^2,  q the attention weight of the other token.

Its scale function s, s'(rho) = (1 - rho^2)^(-1/2) exp(-int_0^rho g / (1 - u^2)),
gives P(rho_t -> -1) = (s(1) - s(rho0)) / (s(1) - s(-1)). The boundary +1 always
attracts; -1 attracts iff g(-1) < 1 (Feller), i.e. cosh(2 beta) > d - 2 for the
values model: the phase transition. Host-side NumPy/SciPy in float64.
"""

import math

import numpy as np
from numpy.typing import ArrayLike
from scipy.integrate import quad
from scipy.special import expit

NOISES = ("values", "tokens")
ATTENTIONS = ("softmax", "unnormalized")
# Relative accuracy asked of every quadrature. Each integrand is smooth once the
# endpoint powers are taken out by the algebraic weight (QAWS), so this is met.
_RTOL = 1e-10
# Difference quotients switch to their Taylor limit this close to an endpoint.
_NEAR = 1e-6


def _check_options(d, sigma, noise, attention):
    """(d, sigma) checked; sigma None is 1 (a time unit) except for "tokens"."""
    if noise not in NOISES:
        raise ValueError(f"`noise` must be one of {NOISES}; got {noise!r}.")
    if attention not in ATTENTIONS:
        raise ValueError(f"`attention` must be one of {ATTENTIONS}; got {attention!r}.")
    if isinstance(d, bool) or not isinstance(d, (int, np.integer)) or d < 2:
        raise ValueError(f"`d` must be an integer >= 2; got {d!r}.")
    if sigma is None:
        if noise == "tokens":
            raise ValueError(
                "`sigma` is required with noise='tokens' (the drift competes with "
                "the noise); got None."
            )
        return int(d), 1.0
    value = np.asarray(sigma, dtype=np.float64)
    if value.ndim != 0 or not (np.isfinite(value) and value > 0):
        raise ValueError(f"`sigma` must be a positive finite scalar; got {sigma!r}.")
    return int(d), float(value)


def _weights(rho, beta, attention):
    """(p, q): attention weights of a token on itself and on the other token.

    Softmax with A = beta I: p = 1 / (1 + e^{-beta (1 - rho)}), q = 1 - p. The
    unnormalised kernel with the uniform weights 1/2 of `mf.Particles`:
    p = e^beta / 2, q = e^{beta rho} / 2.
    """
    x = beta * (1 - rho)
    if attention == "softmax":
        return expit(x), expit(-x)
    return np.full_like(rho, np.exp(beta) / 2), np.exp(beta * rho) / 2


def pair_coefficients(
    rho: ArrayLike,
    beta: float,
    *,
    d: int,
    sigma: float | None = None,
    noise: str = "values",
    attention: str = "softmax",
) -> tuple[np.ndarray, np.ndarray]:
    """Drift b and diffusion a of rho = <x_1, x_2> for two tokens on S^{d-1}.

    With m = 2 p q, r = p^2 + q^2 (p, q the attention weights of a token on
    itself and on the other, `A = beta I`), and sigma^2 / d the variance rate of
    an entry of B (docs/math/common-noise.md):

        values:  b = (sigma^2 / d)(1 - rho^2)((d - 2) m - r rho),
                 a = 2 (sigma^2 / d) r (1 - rho^2)^2
        tokens:  b = (1 - rho^2)(2 q - (sigma^2 / d) rho),
                 a = 2 (sigma^2 / d)(1 - rho^2)^2

    Args:
        rho: inner products in [-1, 1], any shape.
        beta: interaction strength (A = beta I), >= 0.
        d: dimension, >= 2.
        sigma: noise level (default 1 for "values", where it only rescales
            time; required for "tokens").
        noise: "values" (Fedorov et al.'s random value matrices) or "tokens"
            (`mf.CommonNoise` added to the attention drift, V = I).
        attention: "softmax" or "unnormalized" (kernel e^{beta <x, y>} with
            the uniform weights 1/2).

    Returns:
        (b, a), each of the shape of `rho`.

    Raises:
        ValueError: an unknown option, d < 2, sigma not positive, beta < 0,
            rho outside [-1, 1].
    """
    d, sig = _check_options(d, sigma, noise, attention)
    beta = _check_beta(beta)
    rho = np.asarray(rho, dtype=np.float64)
    if not np.all((rho >= -1) & (rho <= 1)):
        raise ValueError("`rho` must lie in [-1, 1].")
    p, q = _weights(rho, beta, attention)
    rate = sig**2 / d
    one = 1 - rho**2
    if noise == "values":
        r = p**2 + q**2
        return rate * one * ((d - 2) * 2 * p * q - r * rho), 2 * rate * r * one**2
    return one * (2 * q - rate * rho), 2 * rate * one**2


def _check_beta(beta) -> float:
    try:
        value = float(beta)
    except (TypeError, ValueError) as err:
        raise ValueError(f"`beta` must be a number >= 0; got {beta!r}.") from err
    if not (np.isfinite(value) and value >= 0):
        raise ValueError(f"`beta` must be finite and >= 0; got {beta!r}.")
    return value


class _Scale:
    """The scale density s' of rho for one (beta, d, sigma, noise, attention).

    2 b / a = (g - rho) / (1 - rho^2) with g >= 0, so

        log s'(rho) = -log(1 - rho^2) / 2 - G(rho),  G = int_0^rho g / (1 - u^2).

    Near -1, s' = (1 + rho)^alpha F(rho) with alpha = -(1 + g(-1)) / 2 and F
    smooth: G - (g(-1) / 2) log(1 + rho) is the integral of the bounded
    g / (2 (1 - u)) + (g - g(-1)) / (2 (1 + u)). Near +1 likewise with
    gamma = (g(1) - 1) / 2. A singular power (exponent in (-1, 1)) goes to the
    algebraic weight of QAWS; a larger one stays in the integrand, evaluated as
    one exponential of a sum: the weight's moments would otherwise have to cancel
    a smooth factor that varies like e^{g(1)}.
    """

    def __init__(self, beta, d, sigma, noise, attention):
        self.beta, self.d, self.sigma = beta, d, sigma
        self.noise, self.attention = noise, attention
        self.g_lo, self.g_hi = self.g(np.float64(-1.0)), self.g(np.float64(1.0))
        self.alpha = -(1 + self.g_lo) / 2
        self.gamma = (self.g_hi - 1) / 2
        # s' spans many decades for small sigma: scale it by e^{-max(-G)} (grid).
        grid = np.cos(np.pi * (np.arange(33) + 0.5) / 33)
        self.shift = max(-self._integral(self._g_sphere, u) for u in grid)

    def g(self, u):
        """(d - 2) 2pq / (p^2 + q^2) (values) or 2 d q / sigma^2 (tokens)."""
        beta, d = self.beta, self.d
        if self.noise == "values":
            # 2pq / (p^2 + q^2) = sech(beta (1 - u)), for both attentions.
            x = beta * (1 - u)
            return (d - 2) * 2 * np.exp(-x) / (1 + np.exp(-2 * x))
        _, q = _weights(u, beta, self.attention)
        return 2 * d * q / self.sigma**2

    def dg(self, u):
        """g'(u): the limits of the difference quotients at the endpoints."""
        beta, d = self.beta, self.d
        if self.noise == "values":
            x = beta * (1 - u)
            sech = 2 * np.exp(-x) / (1 + np.exp(-2 * x))
            return (d - 2) * beta * sech * np.tanh(x)
        p, q = _weights(u, beta, self.attention)
        dq = beta * p * q if self.attention == "softmax" else beta * q
        return 2 * d * dq / self.sigma**2

    def _g_sphere(self, u):
        return self.g(u) / (1 - u * u)

    def _r_lo(self, u):
        """The integrand g / (1 - u^2) less g(-1) / (2 (1 + u)): bounded near -1."""
        g = self.g(u)
        quotient = self.dg(u) if 1 + u < _NEAR else (g - self.g_lo) / (1 + u)
        return g / (2 * (1 - u)) + quotient / 2

    def _r_hi(self, u):
        """The integrand g / (1 - u^2) less g(1) / (2 (1 - u)): bounded near +1."""
        g = self.g(u)
        quotient = -self.dg(u) if 1 - u < _NEAR else (g - self.g_hi) / (1 - u)
        return g / (2 * (1 + u)) + quotient / 2

    @staticmethod
    def _integral(f, rho):
        if rho == 0:
            return 0.0
        # An exponent: its absolute error is the relative error of s'.
        value, _ = quad(f, 0.0, rho, epsabs=1e-13, epsrel=_RTOL, limit=200)
        return value

    def _log_lo(self, rho):
        """The smooth part log s' - alpha log(1 + rho) - shift on [-1, 0]."""
        h = self._integral(self._r_lo, rho)
        return -np.log1p(-rho) / 2 - h - self.shift

    def _log_hi(self, rho):
        """The smooth part log s' - gamma log(1 - rho) - shift on [0, 1]."""
        h = self._integral(self._r_hi, rho)
        return -np.log1p(rho) / 2 - h - self.shift

    def mass(self, lo, hi):
        """int_lo^hi s'(rho) d rho times e^{-shift}, for [lo, 0] or [0, hi] sides."""
        if hi <= lo:
            return 0.0
        if lo < 0 < hi:
            return self.mass(lo, 0.0) + self.mass(0.0, hi)
        if hi <= 0:
            power, side, at_end = self.alpha, self._log_lo, lo == -1
            wvar = (power, 0.0)
        else:
            power, side, at_end = self.gamma, self._log_hi, hi == 1
            wvar = (0.0, power)
        if at_end and power < 1:  # a singular (or rough) power: QAWS's weight
            kwargs = dict(weight="alg", wvar=wvar)

            def f(rho):
                return math.exp(side(rho))

        else:  # inside, or a large power at the end: one exponential of a sum
            kwargs = {}

            def f(rho):
                base = np.log1p(rho) if hi <= 0 else np.log1p(-rho)
                return math.exp(power * base + side(rho))

        value, _ = quad(f, lo, hi, epsabs=0, epsrel=_RTOL, limit=200, **kwargs)
        return value


def antipodal_probability(
    rho0: ArrayLike,
    beta: ArrayLike,
    *,
    d: int,
    sigma: float | None = None,
    noise: str = "values",
    attention: str = "softmax",
) -> np.ndarray:
    """P(<x_1, x_2> -> -1): the probability that two tokens end antipodal.

    For two tokens on S^{d-1} under a common matrix noise (Fedorov, Sander,
    Elie, Marion & Lauriere, 2026; arXiv 2601.21942), rho_t = <x_1, x_2>
    converges almost surely to -1 or +1 (both boundaries are natural: reached
    only as t -> infinity). With s the scale function of rho
    ([The scale function][math-common-noise-scale]):

        P = (s(1) - s(rho0)) / (s(1) - s(-1))   if g(-1) < 1 (-1 attracts),
        P = 0                                     if g(-1) >= 1 (s(-1) = -inf:
                                                  rho -> +1 almost surely),

    with g(-1) = (d - 2) / cosh(2 beta) ("values") or 2 d q(-1) / sigma^2
    ("tokens"). rho0 = -1 and +1 are fixed points: P = 1 and 0 there. The
    integrals are SciPy QAWS quadratures (relative accuracy 1e-10), the endpoint
    singularities taken exactly by the algebraic weight.

    Args:
        rho0: initial inner products in [-1, 1], any shape.
        beta: interaction strength (A = beta I), >= 0; broadcast with rho0.
        d: dimension, >= 2.
        sigma: noise level. Ignored by "values", where it only rescales time
            (P does not depend on it); required for "tokens".
        noise: "values" (the value matrices are the noise: Fedorov et al.'s
            depth limit, no drift) or "tokens" (`mf.CommonNoise(sigma)` with
            the attention drift, V = I, normalization="sphere").
        attention: "softmax" or "unnormalized" (e^{beta <x, y>} with the
            uniform weights 1/2 of `mf.Particles`). With "values" both give the
            same P (only the ratio of the two weights enters).

    Returns:
        float64 array of the broadcast shape of (rho0, beta), in [0, 1].

    Raises:
        ValueError: an unknown option, d < 2, sigma not positive, beta < 0 or
            not finite, rho0 outside [-1, 1].
    """
    d, sig = _check_options(d, sigma, noise, attention)
    rho0 = np.asarray(rho0, dtype=np.float64)
    betas = np.asarray(beta, dtype=np.float64)
    if not np.all((rho0 >= -1) & (rho0 <= 1)):
        raise ValueError("`rho0` must lie in [-1, 1].")
    if not np.all(np.isfinite(betas) & (betas >= 0)):
        raise ValueError(f"`beta` must be finite and >= 0; got {beta!r}.")
    rho0, betas = np.broadcast_arrays(rho0, betas)
    out = np.empty(rho0.shape)
    scales: dict[float, tuple[_Scale, float]] = {}
    for index in np.ndindex(rho0.shape):
        r0, b = float(rho0[index]), float(betas[index])
        if r0 == -1 or r0 == 1:
            out[index] = 1.0 if r0 == -1 else 0.0
            continue
        if b not in scales:
            scale = _Scale(b, d, sig, noise, attention)
            total = np.inf if scale.g_lo >= 1 else scale.mass(-1.0, 1.0)
            scales[b] = (scale, total)
        scale, total = scales[b]
        if not np.isfinite(total):
            out[index] = 0.0  # -1 does not attract: s(-1) = -inf
            continue
        # The smaller side directly: no cancellation when P is near 0 or 1.
        if r0 <= 0:
            out[index] = 1 - scale.mass(-1.0, r0) / total
        else:
            out[index] = scale.mass(r0, 1.0) / total
    return np.clip(out, 0.0, 1.0)


def antipodal_threshold(
    *,
    d: int,
    sigma: float | None = None,
    noise: str = "values",
    attention: str = "softmax",
) -> float:
    """Critical beta: -1 attracts (P > 0 from every rho0 > -1) iff beta > it.

    The boundary -1 attracts iff g(-1) < 1 ([Boundaries][math-common-noise-feller]):

        values:                (d - 2) / cosh(2 beta) < 1,
                               beta_c = arccosh(d - 2) / 2   (d >= 3);
        tokens, softmax:       2 d / (sigma^2 (1 + e^{2 beta})) < 1,
                               beta_c = log(2 d / sigma^2 - 1) / 2;
        tokens, unnormalized:  d e^{-beta} / sigma^2 < 1,
                               beta_c = log(d / sigma^2).

    The "values" threshold is that of the two-token reduction of Fedorov et
    al.'s depth limit (2026), with beta the coefficient of <x_1, x_2> in the
    attention logit: derived here, not read from their theorem
    ([Comparison with Fedorov et al.][math-common-noise-paper]).
    Where the inequality holds for every real beta (values with d = 2;
    tokens/softmax with sigma^2 >= 2 d) the result is -inf; it may be negative
    (then every beta >= 0 is above it). At beta = beta_c itself -1 does not
    attract (P = 0).

    Args:
        d: dimension, >= 2.
        sigma: noise level (required for "tokens"; ignored by "values").
        noise: "values" or "tokens" (see `antipodal_probability`).
        attention: "softmax" or "unnormalized".

    Returns:
        beta_c, a float (possibly -inf or negative).

    Raises:
        ValueError: an unknown option, d < 2, sigma missing or not positive.
    """
    d, sig = _check_options(d, sigma, noise, attention)
    if noise == "values":
        return -math.inf if d == 2 else math.acosh(d - 2) / 2
    ratio = d / sig**2
    if attention == "softmax":
        return -math.inf if 2 * ratio <= 1 else math.log(2 * ratio - 1) / 2
    return math.log(ratio)
