"""Batched blow-up studies and particle cross-checks of the Gaussian moment ODE."""

from collections.abc import Mapping

import equinox as eqx
import jax
import jax.numpy as jnp
from jaxtyping import Array, ArrayLike, Float, Int, PRNGKeyArray

from .. import _status
from .._attention.base import AbstractAttention
from .._dynamics import simulate as simulate_particles
from .._linalg import safe_eigh
from .._measures import Gaussian
from ._ode import GaussianSolution
from ._ode import simulate as simulate_gaussian


class BlowupStudy(eqx.Module):
    """Blow-up times of a batch of parameter sets, per attention variant.

    Attributes:
        t_max: the horizon of the study.
        times: variant name -> blow-up times (batch,), +inf if none on [0, t_max].
        fraction: variant name -> fraction of the batch that blows up (runs that
            ended with another status, see `status`, count as not blowing up).
        rank: variant name -> numerical rank (batch,) of Sigma(t_max) /
            lambda_max(Sigma(t_max)) for the runs that did not blow up (-1 for those
            that did or whose solve failed).
        status: variant name -> result codes (batch,) (see `mf.gaussian.simulate`).
    """

    t_max: float
    times: dict
    fraction: dict
    rank: dict
    status: dict


def numerical_rank(cov: Float[Array, "d d"], rtol: float) -> Int[Array, ""]:
    """Number of eigenvalues above rtol * lambda_max."""
    lam = safe_eigh(cov)[0]
    return jnp.sum(lam > rtol * lam[-1])


def _chunked(fn, batched, chunk_size: int):
    """Apply a vmapped `fn` to a batched pytree in chunks (last chunk padded)."""
    leaves = [leaf for leaf in jax.tree.leaves(batched) if eqx.is_array(leaf)]
    if not leaves:
        raise ValueError("`attns` must hold arrays with a leading batch axis.")
    size = leaves[0].shape[0]
    outs = []
    for start in range(0, size, chunk_size):
        stop = min(start + chunk_size, size)
        idx = jnp.minimum(jnp.arange(start, start + chunk_size), size - 1)
        chunk = jax.tree.map(
            lambda a, idx=idx: a[idx] if eqx.is_array(a) else a, batched
        )
        outs.append(jax.tree.map(lambda o, k=stop - start: o[:k], fn(chunk)))
    return jax.tree.map(lambda *o: jnp.concatenate(o), *outs)


def blowup_times(
    gauss: Gaussian,
    attns: Mapping[str, AbstractAttention] | AbstractAttention,
    t_max: float,
    *,
    rank_rtol: float = 1e-3,
    rtol: float = 1e-6,
    atol: float = 1e-6,
    max_steps: int = 10_000,
    blowup_threshold: float = 1e8,
    chunk_size: int = 512,
) -> BlowupStudy:
    """Blow-up time of the Gaussian moment ODE for a batch of parameter sets.

    Each attention carries a leading batch axis on every array leaf, e.g.
    `jax.vmap(lambda A, V: mf.SoftmaxAttention(V, A=A))(As, Vs)`; the solves run
    under one `jax.vmap` per variant. This is the study of Castin, Ablin, Carrillo
    & Peyre (2025), section on Gaussian blow-up, for any number of parameter sets.

    The limiting covariance of a run that converges loses rank (clustering): its
    eigenvalues in directions where the dynamics contract decay like 1/t (docs/math.md
    section 3), so the numerical rank at t_max is counted relative to rank_rtol;
    choose t_max >> 1 / (rank_rtol * |lambda(M)|).

    Args:
        gauss: the initial Gaussian, shared by every run.
        attns: {variant name: batched attention}, or one batched attention.
        t_max: horizon.
        rank_rtol: relative eigenvalue threshold of the numerical rank.
        rtol: relative tolerance of each solve.
        atol: absolute tolerance of each solve.
        max_steps: step budget of each solve.
        blowup_threshold: see `mf.gaussian.simulate`.
        chunk_size: runs solved together under one vmap. A vmapped adaptive solve
            steps in lockstep until its slowest member ends, so chunks bound the
            cost of a few stiff runs (and very large vmapped batches of diffrax
            solves were seen to stall on CPU).

    Returns:
        A `BlowupStudy`.
    """
    if not isinstance(attns, Mapping):
        attns = {type(attns).__name__: attns}

    def one(attn):
        sol = simulate_gaussian(
            gauss,
            attn,
            t_max,
            rtol=rtol,
            atol=atol,
            max_steps=max_steps,
            blowup_threshold=blowup_threshold,
        )
        rank = numerical_rank(sol.cov[-1], rank_rtol)
        rank = jnp.where(sol.result == _status.SUCCESS, rank, -1)
        return sol.blowup_time, rank, sol.result

    run_chunk = jax.jit(jax.vmap(one))
    times, fraction, rank, status = {}, {}, {}, {}
    for name, attn in attns.items():
        t, r, s = _chunked(run_chunk, attn, chunk_size)
        times[name], rank[name], status[name] = t, r, s
        fraction[name] = float(jnp.mean(jnp.isfinite(t)))
    return BlowupStudy(
        t_max=float(t_max), times=times, fraction=fraction, rank=rank, status=status
    )


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
) -> ParticleComparison:
    """Sample n particles from `gauss`, simulate both, compare the moments.

    The particle system is the mean-field limit's discretisation: its empirical
    mean and covariance converge to alpha(t), Sigma(t) at the Monte Carlo rate
    n^{-1/2} (Castin et al., 2025).

    Args:
        gauss: initial Gaussian.
        attn: softmax, L2, Sinkhorn or multi-head attention.
        n: number of particles.
        ts: comparison times (T,), starting at 0.
        key: PRNG key for the samples.
        dtype: dtype of the particle run (default: the Gaussian's); float32 is
            enough when the Monte Carlo error (~n^{-1/2}) dominates.
        rtol: particle solver's relative tolerance.
        atol: particle solver's absolute tolerance.

    Returns:
        A `ParticleComparison`.
    """
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
