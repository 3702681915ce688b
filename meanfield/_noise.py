"""Brownian forcing of the tokens: the particle systems of noisy Transformers.

A noise is passed to `simulate(..., noise=..., key=...)` (and `layers`,
`simulate_ensemble`). It defines the diffusion g(x) dW added to the attention
drift, for n tokens x (n, d) driven by one Brownian motion W of
`brownian_shape(n, d)` (docs/math/noise.md):

    IndependentNoise   dx_i = Gamma(x_i) dt + sigma dW^i      W (n, d): one per token
    CommonNoise        dx_i = Gamma(x_i) dt + sigma dB x_i    B = W / sqrt(d), W (d, d)

In R^d these are Ito equations: the limits of the residual stack
x <- x + h Gamma + sigma g(x) (W_{t+h} - W_t) (`layers`). Their Stratonovich drift is
Gamma - c(x), c = `ito_correction` (0 for IndependentNoise, whose noise is additive).
On the sphere the model is the Stratonovich projection
dx_i = P^perp_{x_i} (Gamma dt + sigma g(x_i) o dW), the limit of the normalised stack.
"""

import abc
import math

import equinox as eqx
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, ArrayLike, Float

from ._checks import is_traced


def as_sigma(sigma: ArrayLike) -> Array:
    """Sigma as a float array; ValueError when concrete and not a finite scalar >= 0."""
    try:
        if isinstance(sigma, str | bytes):  # jnp.asarray reads "0.1" as characters
            raise TypeError
        s = jnp.asarray(sigma)
    except (TypeError, ValueError) as err:  # a string, None, an object
        raise ValueError(f"`sigma` must be a real number; got {sigma!r}.") from err
    if s.dtype == bool or not (
        jnp.issubdtype(s.dtype, jnp.floating) or jnp.issubdtype(s.dtype, jnp.integer)
    ):
        raise ValueError(f"`sigma` must be a real number; got {sigma!r}.")
    if jnp.issubdtype(s.dtype, jnp.integer):
        s = s.astype(jnp.result_type(float))
    if not is_traced(s):
        value = np.asarray(s)
        if value.ndim != 0 or not (np.isfinite(value) and value >= 0):
            raise ValueError(
                f"`sigma` must be a finite number >= 0 (a scalar); got {sigma!r}."
            )
    return s


class AbstractNoise(eqx.Module):
    """Interface of a Brownian forcing sigma g(x) dW of the tokens.

    Attributes:
        sigma: the noise level, a scalar >= 0 (an array: traced, vmapped and
            differentiated like any parameter).
    """

    sigma: eqx.AbstractVar[Array]

    @abc.abstractmethod
    def brownian_shape(self, n: int, d: int) -> tuple[int, ...]:
        """Shape of the Brownian motion W that drives n tokens in R^d."""

    @abc.abstractmethod
    def kick(self, x: Float[Array, "n d"], dw: Array) -> Float[Array, "n d"]:
        """The displacement sigma g(x) dW of the tokens x for an increment dW."""

    @abc.abstractmethod
    def ito_correction(self, x: Float[Array, "n d"]) -> Float[Array, "n d"]:
        """c(x) = 1/2 sum_k (D g_k) g_k (sigma^2 included), g_k the columns of g.

        The Ito equation dx = b dt + sigma g dW is the Stratonovich equation
        dx = (b - c) dt + sigma g o dW.
        """


class IndependentNoise(AbstractNoise):
    """Each token its own Brownian motion: dx_i = Gamma(x_i) dt + sigma dW^i_t.

    W^1, ..., W^n are independent standard Brownian motions in R^d (W has shape
    (n, d)). On the sphere the noise is projected, dx_i = P^perp_{x_i}(Gamma dt +
    sigma o dW^i): Brownian motion on S^{d-1} with generator (sigma^2 / 2) times
    the Laplace-Beltrami operator, the noisy self-attention dynamics of Mun &
    Rosenzweig (2026; arXiv 2604.16288). With V = 0 on the sphere,
    E<x_i(t), x_i(0)> = exp(-(d - 1) sigma^2 t / 2).

    See [Noise][math-noise].

    Args:
        sigma: the noise level, a finite scalar >= 0 (a float, or an array traced
            under jax.jit/jax.vmap, where it is not checked).

    Raises:
        ValueError: `sigma` not a real scalar (a string, None, a boolean, a
            complex number, an array with a shape), negative, NaN or infinite.
    """

    sigma: Array

    def __init__(self, sigma: ArrayLike):
        self.sigma = as_sigma(sigma)

    def brownian_shape(self, n: int, d: int) -> tuple[int, ...]:
        return (n, d)

    def kick(self, x, dw):
        return self.sigma.astype(x.dtype) * dw

    def ito_correction(self, x):
        # Additive noise: the Ito and Stratonovich equations coincide.
        return jnp.zeros_like(x)


class CommonNoise(AbstractNoise):
    """One matrix Brownian motion for all tokens: dx_i = Gamma(x_i) dt + sigma dB_t x_i.

    B = W / sqrt(d), W a (d, d) matrix of independent standard Brownian motions:
    every entry of B has variance t / d, as a value matrix initialised with
    variance 1/d, and E|dB x|^2 = |x|^2 dt, so sigma is comparable with
    `IndependentNoise`'s for unit tokens. Every token feels the same B: the
    common matrix noise of Fedorov, Sander, Elie, Marion & Lauriere (2026; arXiv
    2601.21942) acting on the tokens (their depth limit of random value matrices
    applies dB to the attention average instead: [Common noise and antipodal
    tokens][math-common-noise]). In R^d (Ito) and V = 0, x_i(t) = M_t x_i(0) with
    one random matrix M_t; on the sphere, dx_i = P^perp_{x_i}(Gamma dt + sigma o
    dB x_i), each token alone a Brownian motion on S^{d-1} at the rate sigma^2 / d.

    See [Noise][math-noise].

    Args:
        sigma: the noise level, a finite scalar >= 0 (a float, or an array traced
            under jax.jit/jax.vmap, where it is not checked).

    Raises:
        ValueError: `sigma` not a real scalar (a string, None, a boolean, a
            complex number, an array with a shape), negative, NaN or infinite.
    """

    sigma: Array

    def __init__(self, sigma: ArrayLike):
        self.sigma = as_sigma(sigma)

    def brownian_shape(self, n: int, d: int) -> tuple[int, ...]:
        return (d, d)

    def kick(self, x, dw):
        # (dB x_i)_k = sum_l dB_kl x_il for every row i at once.
        scale = self.sigma.astype(x.dtype) / math.sqrt(x.shape[-1])
        return scale * (x @ dw.T)

    def ito_correction(self, x):
        # g_kl(x) = sigma E_kl x / sqrt(d) is linear: sum_kl E_kl E_kl = I.
        d = x.shape[-1]
        return (self.sigma.astype(x.dtype) ** 2 / (2 * d)) * x
