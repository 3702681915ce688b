"""The same dynamics as `density.simulate`, sampled by particles on S^1."""

import jax
import numpy as np
from jaxtyping import ArrayLike, Float

from .._attention.ill_posed import UnnormalizedAttention
from .._attention.softmax import SoftmaxAttention
from .._dynamics import Solution, simulate
from .._measures import Particles
from ._circle import _check_attention, _check_beta, _check_representable


def simulate_particles(
    theta: Float[ArrayLike, " n"],
    t1: float,
    *,
    beta: float,
    attention: str = "softmax",
    saveat: ArrayLike | None = None,
    rtol: float = 1e-8,
    atol: float = 1e-8,
    progress: bool = False,
) -> Solution:
    """Tokens at angles theta on S^1 under the model of `density.simulate`.

    `mf.simulate` with A = beta I, V = I and normalization="sphere", in float64:
    the particle system whose empirical measure the density approximates. Read
    the angles back with `density.angles(solution.x)`.

    See [The density on the circle][math-density-equation].

    Args:
        theta: initial angles, shape (n,) (e.g. `sample_quantiles(rho0, n)`).
        t1: final time.
        beta: inverse temperature, > 0.
        attention: "softmax" or "unnormalized".
        saveat: save times (T,) in [0, t1]; None saves 0 and t1.
        rtol: relative tolerance of `mf.simulate`.
        atol: absolute tolerance of `mf.simulate`.
        progress: show a progress bar.

    Returns:
        The particle `Solution`, x of shape (T, n, 2).

    Raises:
        ValueError: `theta` not a finite (n,) array, `beta` not positive, unknown
            `attention`, beta > 709.8 (e^beta beyond float64) with
            attention="unnormalized".
    """
    beta = _check_beta(beta)
    _check_attention(attention)
    _check_representable(beta, attention)
    theta = np.asarray(theta, np.float64)
    if theta.ndim != 1 or theta.size == 0:
        raise ValueError(f"`theta` must have shape (n,), n >= 1; got {theta.shape}.")
    if not np.all(np.isfinite(theta)):
        # Checked here: the tokens built from it would be named `x` in the error.
        bad = int(np.sum(~np.isfinite(theta)))
        raise ValueError(f"`theta` must be finite; got {bad} NaN or inf angle(s).")
    family = SoftmaxAttention if attention == "softmax" else UnnormalizedAttention
    with jax.enable_x64(True):
        return simulate(
            Particles(np.stack([np.cos(theta), np.sin(theta)], 1)),
            family(np.eye(2), A=beta * np.eye(2)),
            t1,
            saveat=saveat,
            normalization="sphere",
            rtol=rtol,
            atol=atol,
            progress=progress,
        )
