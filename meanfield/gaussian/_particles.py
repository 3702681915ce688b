"""Particle cross-checks of the Gaussian moment ODE: empirical moments against it."""

import equinox as eqx
import jax
import jax.numpy as jnp
from jaxtyping import Array, ArrayLike, Float, PRNGKeyArray

from .._attention.base import AbstractAttention
from .._dynamics import simulate as simulate_particles
from .._feedforward import FeedForward
from .._measures import Gaussian
from ._ode import GaussianSolution
from ._ode import simulate as simulate_gaussian
from ._velocity import with_ffn


class ParticleComparison(eqx.Module):
    """Empirical moments of n particles against the Gaussian moment ODE.

    Attributes:
        ts: times (T,).
        mean_error: |mean_n(t) - alpha(t)| / sqrt(tr Sigma(t)), shape (T,) (the
            Monte Carlo scale: ~ n^{-1/2}).
        cov_error: |Sigma_n(t) - Sigma(t)|_F / |Sigma(t)|_F, shape (T,).
        particles: the particle `Solution`.
        gaussian: the `GaussianSolution`.
    """

    ts: Float[Array, " T"]
    mean_error: Float[Array, " T"]
    cov_error: Float[Array, " T"]
    particles: eqx.Module
    gaussian: GaussianSolution


def compare_particles(
    gauss: Gaussian,
    attn: AbstractAttention,
    n: int,
    ts: ArrayLike,
    key: PRNGKeyArray,
    *,
    dtype=None,
    rtol: float = 1e-6,
    atol: float = 1e-6,
    ffn: FeedForward | None = None,
) -> ParticleComparison:
    """Sample n particles from `gauss`, simulate both, compare the moments.

    The particle system is the mean-field limit's discretisation: its empirical
    mean and covariance converge to alpha(t), Sigma(t) at the Monte Carlo rate
    n^{-1/2} (Castin et al., 2025).

    Args:
        gauss: initial Gaussian.
        attn: softmax, L2, Sinkhorn or multi-head attention, or an `mf.Block` of
            one with an `mf.FeedForward`.
        n: number of particles.
        ts: comparison times (T,), starting at 0.
        key: PRNG key for the samples.
        dtype: dtype of the particle run (default: the Gaussian's); float32 is
            enough when the Monte Carlo error (~n^{-1/2}) dominates.
        rtol: particle solver's relative tolerance.
        atol: particle solver's absolute tolerance.
        ffn: an affine feed-forward layer `mf.FeedForward(W_f, b_f)` added to both
            (the particles run `mf.Block(attn, ffn)`), or None.

    Returns:
        A `ParticleComparison`.

    Raises:
        ValueError: bad `ts`, or a non-affine feed-forward.
    """
    attn = with_ffn(attn, ffn)
    ts = jnp.asarray(ts)
    if ts.ndim != 1 or ts.shape[0] == 0:
        raise ValueError(f"`ts` must be a non-empty 1-D array; got shape {ts.shape}.")
    t1 = float(ts[-1])
    mu = gauss.sample(key, n)
    if dtype is not None:
        mu = eqx.tree_at(
            lambda m: (m.x, m.weights),
            mu,
            (mu.x.astype(dtype), mu.weights.astype(dtype)),
        )
        attn = jax.tree.map(
            lambda a: a.astype(dtype) if eqx.is_inexact_array(a) else a, attn
        )
    psol = simulate_particles(mu, attn, t1, saveat=ts, rtol=rtol, atol=atol)
    gsol = simulate_gaussian(gauss, attn, t1, saveat=ts)
    x = psol.x.astype(gsol.mean.dtype)
    emp_mean = jnp.mean(x, axis=1)
    centred = x - emp_mean[:, None, :]
    emp_cov = jnp.einsum("tni,tnj->tij", centred, centred) / (n - 1)
    mean_err = jnp.linalg.norm(emp_mean - gsol.mean, axis=-1) / jnp.sqrt(
        jnp.trace(gsol.cov, axis1=-2, axis2=-1)
    )
    cov_err = jnp.linalg.norm(emp_cov - gsol.cov, axis=(-2, -1)) / jnp.linalg.norm(
        gsol.cov, axis=(-2, -1)
    )
    return ParticleComparison(
        ts=ts, mean_error=mean_err, cov_error=cov_err, particles=psol, gaussian=gsol
    )
