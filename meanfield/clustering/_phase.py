"""Phase diagrams of clustering over the temperature beta (ensembles of systems).

Geshkovski, Letrouit, Polyanskiy & Rigollet ("A mathematical perspective on
Transformers", 2023) draw, for n tokens uniform on the sphere with A = beta I and
V = I, the fraction of token pairs that have merged as a function of beta and t.
`phase_diagram` computes that heat map from `mf.simulate_ensemble` solves, and
`equiangular_time` the curve it is compared with: n tokens with all pairwise inner
products equal to rho stay equiangular, with (docs/math/clusters.md)

    rho' = 2 (1 - rho) ((n - 1) rho + 1) / (e^{beta (1 - rho)} + n - 1).
"""

import warnings

import equinox as eqx
import jax
import jax.numpy as jnp
import jax.random as jr
import numpy as np
from jaxtyping import Array, Float
from scipy.integrate import quad

from .._attention.ill_posed import UnnormalizedAttention
from .._attention.multihead import MultiHeadAttention
from .._attention.softmax import SoftmaxAttention
from .._checks import reject_result
from .._dynamics import Solution
from .._ensemble import ChunkLog, simulate_ensemble
from .._measures import MaskedParticles, Particles
from .._noise import AbstractNoise
from .._noisy_solve import default_tolerance
from .._repr import fields_repr
from .._status import SUCCESS

ATTENTIONS = ("softmax", "unnormalized")
DTYPES = ("float32", "float64")
# Systems x saves x n^2 Gram entries held at once by pair_alignment.
_GRAM_ENTRIES = 1 << 22


def _aligned_fraction(x, eps):
    """Fraction of off-diagonal pairs of x (n, d) with <theta_i, theta_j> > 1 - eps."""
    n = x.shape[-2]
    theta = x / jnp.linalg.norm(x, axis=-1, keepdims=True)
    gram = theta @ theta.T
    aligned = jnp.sum(gram > 1 - eps) - jnp.sum(jnp.diag(gram) > 1 - eps)
    fraction = aligned / (n * (n - 1))
    return jnp.where(jnp.all(jnp.isfinite(x)), fraction, jnp.nan)


def pair_alignment(x: Float[Array, "... n d"] | Solution, eps: float = 1e-3) -> Array:
    """Fraction of token pairs i != j with aligned directions: <θᵢ, θⱼ> > 1 − eps.

    See [Pair alignment and phase diagrams][math-phase-diagram].

    Args:
        x: tokens, shape (..., n, d), any leading axes (systems, save times).
            θᵢ = xᵢ / |xᵢ|. A `Solution` stands for its tokens `sol.x` (T, n, d)
            at every save time ((B, T, n, d) for `mf.simulate_ensemble`).
        eps: alignment tolerance on the inner product of directions.

    Returns:
        Shape (...) ((T,) for a `Solution`): 1 when every pair is aligned (one
        cluster); NaN where a system holds a non-finite token (a save after a
        blow-up, a save time not reached).

    Raises:
        ValueError: x with fewer than 2 tokens or fewer than 2 axes, eps outside (0, 2).
        TypeError: `x` is another result (e.g. a `MergingSolution`) or a measure.
    """
    if isinstance(x, Solution):  # unreached save times hold +inf: NaN below
        x = x.x
    reject_result(x, "x", "pair_alignment", expected="an array of tokens (..., n, d)")
    x = jnp.asarray(x)
    if x.ndim < 2 or x.shape[-2] < 2:
        raise ValueError(f"`x` must have shape (..., n, d) with n >= 2; got {x.shape}.")
    if not 0 < eps < 2:
        raise ValueError(f"`eps` must be in (0, 2); got {eps}.")
    lead = x.shape[:-2]
    flat = x.reshape((-1,) + x.shape[-2:])
    batch = max(1, _GRAM_ENTRIES // x.shape[-2] ** 2)
    out = jax.lax.map(lambda a: _aligned_fraction(a, eps), flat, batch_size=batch)
    return out.reshape(lead)


def equiangular_rate(rho, beta: float, n: int):
    """Rate rho' of n equiangular tokens on the sphere (softmax, A = beta I, V = I).

    See [Equiangular tokens][math-equiangular] for the derivation.
    """
    rho = np.asarray(rho, np.float64)
    return 2 * (1 - rho) * ((n - 1) * rho + 1) / (np.exp(beta * (1 - rho)) + n - 1)


def equiangular_time(
    beta: float, n: int, eps: float = 1e-3, rho0: float = 0.0
) -> float:
    """Time for n equiangular tokens to go from <θᵢ, θⱼ> = rho0 to 1 − eps.

    t = ∫ d rho / rho'(rho) from rho0 to 1 - eps (adaptive quadrature; the rate
    is positive on (-1/(n-1), 1)).

    See [Equiangular tokens][math-equiangular] for the derivation.

    Raises:
        ValueError: rho0 outside (-1/(n-1), 1 - eps).
    """
    if not -1 / (n - 1) < rho0 < 1 - eps:
        raise ValueError(
            f"`rho0` must be in (-1/(n-1), 1 - eps) = ({-1 / (n - 1):.3g}, {1 - eps}); "
            f"got {rho0}."
        )
    value, _ = quad(
        lambda r: 1 / equiangular_rate(r, beta, n), rho0, 1 - eps, limit=200
    )
    return float(value)


class PhaseDiagram(eqx.Module):
    """Pair alignment over (beta, t) for an ensemble of systems per beta.

    Attributes:
        betas: temperatures (K,).
        ts: save times (T,).
        density: mean over systems of `pair_alignment` (K, T), over the systems
            that reached t1 (`completed`).
        one_cluster: fraction of systems whose pairs are all aligned (K, T); a
            system that stopped early counts as not in one cluster.
        completed: fraction of systems whose solve reached t1 with status
            "success" (K,); 1 unless a solve blew up or ran out of steps.
        mean_steps: mean number of attempted solver steps per system (K,).
        n: tokens per system.
        eps: the alignment tolerance.
    """

    betas: np.ndarray
    ts: np.ndarray
    density: np.ndarray
    one_cluster: np.ndarray
    completed: np.ndarray
    mean_steps: np.ndarray
    n: int = eqx.field(static=True)
    eps: float = eqx.field(static=True)

    def __repr__(self) -> str:
        return fields_repr(
            self,
            n=self.n,
            eps=self.eps,
            betas=self.betas,
            completed=self.completed,
            ts=self.ts,
            density=self.density,
        )

    def theory(self, rho0: float = 0.0) -> np.ndarray:
        """Equiangular merging time of each beta (K,), from <θᵢ, θⱼ> = rho0."""
        return np.array(
            [equiangular_time(float(b), self.n, self.eps, rho0) for b in self.betas]
        )


def head_attention(beta, d: int, attention: str = "softmax", heads: int = 1):
    """The attention of the diagram at temperature beta: V = I, A = beta I.

    With heads = H > 1 the d coordinates split into H blocks of width d/H, as in
    a Transformer layer whose heads see slices of the stream: head h attends with
    A_h = beta P_h and writes back V_h = P_h (P_h the projector on block h), so
    Gamma = sum_h P_h Gamma_h. heads = 1 is the single head V = I, A = beta I.

    See [Heads][math-phase-heads].
    """
    family = SoftmaxAttention if attention == "softmax" else UnnormalizedAttention
    eye = jnp.eye(d, dtype=jnp.result_type(beta))
    if heads == 1:
        return family(eye, A=beta * eye)
    width = d // heads
    blocks = [
        jnp.diag((jnp.arange(d) // width == h).astype(eye.dtype)) for h in range(heads)
    ]
    return MultiHeadAttention([family(P, A=beta * P) for P in blocks])


def _alignment_and_success(sol, eps):
    """A chunk's pair alignment (B, T), success (B,) and attempted steps (B,)."""
    return pair_alignment(sol.x, eps), sol.result == SUCCESS, sol.num_steps


def phase_diagram(
    betas,
    *,
    n: int = 32,
    d: int = 2,
    systems: int = 2048,
    t1: float = 30.0,
    saveat=None,
    key: Array | None = None,
    attention: str = "softmax",
    normalization: str = "sphere",
    masked: bool = False,
    heads: int = 1,
    eps: float = 1e-3,
    rtol: float | None = None,
    atol: float | None = None,
    chunk_size: int = 16384,
    progress: bool = False,
    noise: AbstractNoise | None = None,
    noise_key: Array | None = None,
    dtype: str | None = None,
    chunks: ChunkLog | None = None,
    **options,
) -> PhaseDiagram:
    """Clustering phase diagram: pair alignment over beta and t.

    For each beta, `systems` systems of n tokens drawn uniformly on the sphere
    S^{d-1} (one key for the whole grid: the same tokens for any chunking),
    V = I and A = beta I (`head_attention`), solved with `mf.simulate_ensemble`
    in chunks of systems, each reduced to its pair alignment at the save times
    inside the chunk's compiled program (`reduce`): memory O(chunk_size T n^2)
    besides the initial tokens, and every chunk runs the same program.

    The default tolerance rtol = atol = 1e-6 keeps the integration error of the
    density below 1e-4 on six of seven samples of 6 betas x 256 systems checked
    against a float64 solve at 1e-10 (one flipped pair, 8e-6, on most), while the
    standard error of a mean over 2048 systems is 1.8e-3. The exception is a
    merge of two clusters within float32's resolution of a save time: only
    float64 at rtol = atol = 1e-7 resolves it ([The tolerance of a
    diagram][math-phase-tolerance]). Without noise
    the systems go through `mf.simulate_ensemble`'s work queue (each system its
    own adaptive solve, a finished system handing its slot to the next one).

    With `noise` every system is a noisy `mf.simulate` (`mf.simulate_ensemble`
    with `noise=`): system s of the k-th beta, member b = k * systems + s, runs
    on the Brownian path of `jax.random.split(noise_key, len(betas) * systems)[b]`,
    with `noise_key = jax.random.fold_in(key, 1)` by default. The initial tokens
    are drawn from `key` itself, as without noise: adding a noise changes the
    paths, not the tokens.

    See [Pair alignment and phase diagrams][math-phase-diagram] and
    [The tolerance of a diagram][math-phase-tolerance].

    Args:
        betas: temperatures (K,), positive.
        n: tokens per system.
        d: dimension.
        systems: systems per beta.
        t1: horizon.
        saveat: save times (T,); default 31 points on [0, t1].
        key: PRNG key of the initial tokens (default jax.random.key(0)).
        attention: "softmax" or "unnormalized" (k = e^{beta <x, y>}, no
            normalisation).
        normalization: forwarded to `mf.simulate` ("sphere" for the LayerNorm
            model).
        masked: causal attention (token i attends to j <= i).
        heads: attention heads, each on a block of d / heads coordinates
            (`head_attention`); must divide d.
        eps: alignment tolerance of `pair_alignment`.
        rtol: the solver's relative tolerance; None: 1e-6 without noise,
            `mf.simulate`'s default with noise (1e-3).
        atol: the solver's absolute tolerance; None as `rtol`.
        chunk_size: systems per compiled call (bounds memory: the saves of a
            chunk, chunk_size x T x n x d numbers, are held at once).
        progress: progress bar over the chunks (`simulate_ensemble`'s).
        noise: None, or one noise for every system (`mf.IndependentNoise(sigma)`,
            `mf.CommonNoise(sigma)`; normalization None or "sphere").
        noise_key: PRNG key of the Brownian paths (see above); None:
            `jax.random.fold_in(key, 1)`. Only with `noise`.
        dtype: "float32" or "float64", the solves' arithmetic; None: float32
            without noise (see above), the default float type with noise. The
            initial tokens are drawn in the default float type and then
            rounded, so both see the same tokens.
        chunks: None, or an `mf.ChunkLog` to checkpoint and resume the diagram
            by its chunks of systems (`mf.simulate_ensemble`'s `chunks`): a
            chunk's output is a tuple (pair alignment (w, T), success (w,),
            attempted steps (w,)) of its w systems (system s of the k-th beta
            is member k * systems + s). With
            the log of an interrupted call of the same arguments, the diagram
            is bit for bit the uninterrupted one.
        **options: forwarded to `mf.simulate` (solver, dt0, max_steps, ...).

    Returns:
        A `PhaseDiagram`.

    Raises:
        ValueError: unknown attention, non-positive betas, n < 2, d < 1,
            systems < 1, chunk_size < 1, heads not dividing d, an unknown
            dtype (or "float64" without `jax_enable_x64`), `noise_key`
            without `noise`, a noise `mf.simulate` refuses (another
            normalization, an ODE-only solver).
    """
    betas = np.asarray(betas, np.float64).reshape(-1)
    if attention not in ATTENTIONS:
        raise ValueError(f"`attention` must be one of {ATTENTIONS}; got {attention!r}.")
    if betas.size == 0 or not np.all(betas > 0) or not np.all(np.isfinite(betas)):
        raise ValueError(f"`betas` must be positive and finite; got {betas}.")
    for label, value, low in (
        ("n", n, 2),
        ("d", d, 1),
        ("systems", systems, 1),
        ("chunk_size", chunk_size, 1),
        ("heads", heads, 1),
    ):
        if int(value) != value or int(value) < low:
            raise ValueError(f"`{label}` must be an integer >= {low}; got {value}.")
    if d % heads:
        raise ValueError(f"`heads` must divide d = {d}; got heads = {heads}.")
    if dtype is None:
        dtype = "float32" if noise is None else jnp.result_type(float).name
    if dtype not in DTYPES:
        raise ValueError(f"`dtype` must be one of {DTYPES}; got {dtype!r}.")
    if dtype == "float64" and not jax.config.jax_enable_x64:
        raise ValueError(
            '`dtype="float64"` needs 64-bit JAX: jax.config.update("jax_enable_x64", '
            "True) before any array is created."
        )
    ts = np.linspace(0.0, t1, 31) if saveat is None else np.asarray(saveat, np.float64)
    key = jr.key(0) if key is None else key
    if noise is None and noise_key is not None:
        raise ValueError("`noise_key` draws the Brownian paths of `noise`: pass both.")
    if noise is not None and noise_key is None:
        # Not split from `key`: the tokens below stay those of the noise-free run.
        noise_key = jr.fold_in(key, 1)
    tol = default_tolerance(noise is not None)
    rtol = tol if rtol is None else rtol
    atol = tol if atol is None else atol
    x = jr.normal(key, (betas.size * systems, n, d), jnp.result_type(float))
    x = (x / jnp.linalg.norm(x, axis=-1, keepdims=True)).astype(dtype)
    if masked:
        positions = jnp.broadcast_to(jnp.arange(n, dtype=dtype) / n, x.shape[:2])
        measures = jax.vmap(MaskedParticles)(x, positions)
    else:
        measures = jax.vmap(Particles)(x)
    per_system = jnp.repeat(jnp.asarray(betas, dtype), systems)
    attn = jax.vmap(lambda b: head_attention(b, d, attention, heads))(per_system)
    aligned, completed, steps = simulate_ensemble(
        measures,
        attn,
        float(t1),
        batched_attention=True,
        chunk_size=int(chunk_size),
        progress=progress,
        reduce=eqx.Partial(_alignment_and_success, eps=float(eps)),
        saveat=ts,
        normalization=normalization,
        rtol=float(rtol),
        atol=float(atol),
        noise=noise,
        key=noise_key,
        chunks=chunks,
        **options,
    )
    aligned = np.asarray(aligned).reshape(betas.size, systems, -1)
    completed = np.asarray(completed).reshape(betas.size, systems)
    with warnings.catch_warnings():  # a beta whose every system stopped early
        warnings.simplefilter("ignore", RuntimeWarning)
        density = np.nanmean(np.where(completed[..., None], aligned, np.nan), axis=1)
    return PhaseDiagram(
        betas=betas,
        ts=ts,
        density=density,
        one_cluster=np.mean(completed[..., None] & (aligned == 1), axis=1),
        completed=completed.mean(axis=1),
        mean_steps=np.asarray(steps).reshape(betas.size, systems).mean(axis=1),
        n=int(n),
        eps=float(eps),
    )
