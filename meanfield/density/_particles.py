"""The dynamics of the density solvers, sampled by tokens on S^1 and S^{d-1}."""

import jax
import numpy as np
from jaxtyping import ArrayLike, Float

from .._attention.ill_posed import UnnormalizedAttention
from .._attention.softmax import SoftmaxAttention
from .._dynamics import Solution, simulate
from .._measures import Particles
from .._noise import IndependentNoise
from ._circle import check_attention, check_beta, check_representable, check_sigma

#: Tolerances of the noise-free particle solve (sigma = 0): the particles then
#: follow their ODE far below the density's discretisation error.
ODE_TOLERANCE = 1e-8


def simulate_particles(
    theta: Float[ArrayLike, " n"],
    t1: float,
    *,
    beta: float,
    attention: str = "softmax",
    sigma: float = 0.0,
    key: jax.Array | None = None,
    saveat: ArrayLike | None = None,
    rtol: float | None = None,
    atol: float | None = None,
    progress: bool = False,
) -> Solution:
    """Tokens at angles theta on S^1 under the model of `density.simulate`.

    `mf.simulate` with A = beta I, V = I and normalization="sphere", in float64:
    the particle system whose empirical measure the density approximates. With
    sigma > 0 every token has its own Brownian motion on the circle,
    d theta_i = v(theta_i) dt + sigma dW^i (`mf.IndependentNoise(sigma)` projected
    on S^1), the particles of the density with diffusion (sigma^2 / 2) d^2 rho;
    the solve is then an SDE solve (Heun's method, adaptive). Read the angles
    back with `density.angles(solution.x)`.

    See [The density on the circle][math-density-equation] and
    [Noise][math-noise].

    Args:
        theta: initial angles, shape (n,) (e.g. `sample_quantiles(rho0, n)`).
        t1: final time.
        beta: inverse temperature, > 0.
        attention: "softmax" or "unnormalized".
        sigma: noise level of the tokens, finite, >= 0; 0 is the ODE.
        key: a JAX PRNG key, `jax.random.key(seed)`, of the Brownian paths;
            required when sigma > 0, unused when sigma = 0. One key is one
            path: the same key gives the same run.
        saveat: save times (T,) in [0, t1]; None saves 0 and t1.
        rtol: relative tolerance of `mf.simulate`; None: 1e-8 without noise,
            `mf.simulate`'s default with noise (1e-3).
        atol: absolute tolerance of `mf.simulate`; None as `rtol`.
        progress: show a progress bar.

    Returns:
        The particle `Solution`, x of shape (T, n, 2).

    Raises:
        ValueError: `theta` not a finite (n,) array, `beta` not positive, `sigma`
            negative or not finite, sigma > 0 without a PRNG `key`, unknown
            `attention`, beta > 709.8 (e^beta beyond float64) with
            attention="unnormalized".
    """
    theta = np.asarray(theta, np.float64)
    if theta.ndim != 1 or theta.size == 0:
        raise ValueError(f"`theta` must have shape (n,), n >= 1; got {theta.shape}.")
    if not np.all(np.isfinite(theta)):
        # Checked here: the tokens built from it would be named `x` in the error.
        bad = int(np.sum(~np.isfinite(theta)))
        raise ValueError(f"`theta` must be finite; got {bad} NaN or inf angle(s).")
    return simulate_tokens(
        np.stack([np.cos(theta), np.sin(theta)], 1),
        t1,
        beta=beta,
        attention=attention,
        sigma=sigma,
        key=key,
        saveat=saveat,
        rtol=rtol,
        atol=atol,
        progress=progress,
    )


def simulate_tokens(
    x: Float[ArrayLike, "n d"],
    t1: float,
    *,
    beta: float,
    attention: str = "softmax",
    sigma: float = 0.0,
    key: jax.Array | None = None,
    saveat: ArrayLike | None = None,
    rtol: float | None = None,
    atol: float | None = None,
    progress: bool = False,
) -> Solution:
    """Tokens x on S^{d-1} under the model of the density solvers, any d >= 2.

    `mf.simulate` with A = beta I_d, V = I_d and normalization="sphere", in
    float64: the particle system whose empirical measure `simulate` (d = 2),
    `simulate_zonal` and `simulate_sphere` (d = 3) approximate. With sigma > 0
    every token has its own Brownian motion on the sphere
    (`mf.IndependentNoise(sigma)` projected), the particles of the density with
    diffusion (sigma^2 / 2) Delta rho; the solve is then an SDE solve (Heun's
    method, adaptive). Draw x from a density with `sample_zonal` or
    `sample_sphere`.

    See [The density on the sphere][math-sphere-equation].

    Args:
        x: tokens on the unit sphere, shape (n, d), d >= 2.
        t1: final time.
        beta: inverse temperature, > 0.
        attention: "softmax" or "unnormalized".
        sigma: noise level of the tokens, finite, >= 0; 0 is the ODE.
        key: a JAX PRNG key, `jax.random.key(seed)`, of the Brownian paths;
            required when sigma > 0, unused when sigma = 0.
        saveat: save times (T,) in [0, t1]; None saves 0 and t1.
        rtol: relative tolerance of `mf.simulate`; None: 1e-8 without noise,
            `mf.simulate`'s default with noise (1e-3).
        atol: absolute tolerance of `mf.simulate`; None as `rtol`.
        progress: show a progress bar.

    Returns:
        The particle `Solution`, x of shape (T, n, d).

    Raises:
        ValueError: `x` not a finite (n, d) array with d >= 2, `beta` not
            positive, `sigma` negative or not finite, sigma > 0 without a PRNG
            `key`, unknown `attention`, beta > 709.8 (e^beta beyond float64)
            with attention="unnormalized".
    """
    beta = check_beta(beta)
    sigma = check_sigma(sigma)
    check_attention(attention)
    check_representable(beta, attention)
    x = np.asarray(x, np.float64)
    if x.ndim != 2 or x.shape[0] == 0 or x.shape[1] < 2:
        raise ValueError(f"`x` must have shape (n, d), n >= 1, d >= 2; got {x.shape}.")
    if sigma > 0 and key is None:
        raise ValueError(
            "`key` is required with `sigma` > 0 (the Brownian paths): pass "
            "key=jax.random.key(seed)."
        )
    if sigma == 0:  # the ODE, as without the noise arguments
        key = None
        rtol = ODE_TOLERANCE if rtol is None else rtol
        atol = ODE_TOLERANCE if atol is None else atol
    d = x.shape[1]
    family = SoftmaxAttention if attention == "softmax" else UnnormalizedAttention
    with jax.enable_x64(True):
        # Built under x64: sigma is then a float64 array, not rounded to float32.
        noise = IndependentNoise(sigma) if sigma > 0 else None
        return simulate(
            Particles(x),
            family(np.eye(d), A=beta * np.eye(d)),
            t1,
            saveat=saveat,
            normalization="sphere",
            rtol=rtol,
            atol=atol,
            noise=noise,
            key=key,
            progress=progress,
        )
