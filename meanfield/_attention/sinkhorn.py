"""Sinkhorn (doubly stochastic) attention: Sinkformers (Sander et al., AISTATS 2022)."""

import functools
from typing import ClassVar

import equinox as eqx
import jax
import jax.numpy as jnp
import lineax as lx
import optimistix as optx
from jax.scipy.special import logsumexp
from jaxtyping import Array, Bool, Float, Int

from .._custom_types import Param, ParamLike
from .._kernels import blocked as _blocked
from .._kernels import dense as _kernels
from .._linalg import inverse, safe_eigh, sym_sqrt
from .._measures import AbstractParticles, MaskedParticles
from .base import (
    QUERY_BLOCKS,
    AbstractAttention,
    bilinear_features,
    check_blocking,
    init_params,
    interaction_matrix,
    param_at,
    softmax_average,
    use_blocked,
    values_at,
)
from .registry import register

_KERNELS = ("dot", "l2")


class SinkhornPotentials(eqx.Module):
    """Converged Sinkhorn potentials of a measure's self-coupling.

    k_inf(x_i, x_j) = exp(l_ij + f_i + g_j) with sum_j w_j k_inf_ij = 1 (exact: the
    last step is a row normalisation) and sum_i w_i k_inf_ij = 1 up to
    `marginal_error`.

    See [Sinkhorn attention][math-sinkhorn].

    Attributes:
        f: row potentials, shape (n,).
        g: column potentials, shape (n,).
        iterations: number of column normalisations performed.
        marginal_error: max_j |sum_i w_i k_inf_ij - 1|.
        converged: whether the iteration met `tol` within `max_iter`.
    """

    f: Float[Array, " n"]
    g: Float[Array, " n"]
    iterations: Int[Array, ""]
    marginal_error: Float[Array, ""]
    converged: Bool[Array, ""]


def _row_potential(kernel, g, log_w, block):
    # f_i = -logsumexp_j(l_ij + g_j + log w_j): normalise the rows. `kernel` is the
    # logits matrix (dense, block None) or its features (q, keys, bias) (blocked).
    if block is None:
        return -logsumexp(kernel + (g + log_w)[None, :], axis=1)
    q, keys, bias = kernel
    return -_blocked.bilinear_logsumexp(
        q, keys, bias + g + log_w, block_q=QUERY_BLOCKS * block, block_k=block
    )


def _column_potential(kernel, f, log_w, block):
    # g_j = -logsumexp_i(l_ij + f_i + log w_i): normalise the columns.
    if block is None:
        return -logsumexp(kernel + (f + log_w)[:, None], axis=0)
    q, keys, bias = kernel
    lse = _blocked.bilinear_logsumexp(
        keys, q, f + log_w, block_q=QUERY_BLOCKS * block, block_k=block
    )
    return -(lse + bias)


def _sinkhorn_step(g, args, block=None):
    """One column-then-row sweep, in the gauge sum_j w_j g_j = 0.

    The plain map T commutes with shifts, T(g + c) = T(g) + c, so its fixed points
    form a line and (I - dT) is singular; projecting out the shift makes the fixed
    point unique and implicit differentiation well posed. A fixed point of the
    projected map is a true Sinkhorn fixed point: T(g) = g + c forces c = 0 because
    both marginals carry total mass 1.
    """
    kernel, log_w, w = args
    f = _row_potential(kernel, g, log_w, block)
    g_new = _column_potential(kernel, f, log_w, block)
    return g_new - jnp.sum(w * g_new)


@functools.cache
def _step(block):
    # One function object per block size: optimistix compiles its loop once per
    # function object, so a fresh partial per call would recompile every eager call.
    return functools.partial(_sinkhorn_step, block=block)


def sinkhorn_gain(A, root) -> Float[Array, "d d"]:
    """S^T Sigma^{-1} for the entropic self-coupling of N(., Sigma), cost -<A x, y>.

    `root` is any F with F F^T = Sigma (the symmetric square root, or factors
    that keep a graded Sigma's small directions). Stable form of
    docs/math/gaussians.md: S^T Sigma^{-1} = F X F^T A with
    X = 2 (I + (I + 4 G)^{1/2})^{-1} and G = M M^T, M = F^T A F (symmetric PSD;
    F -> F O maps X to O^T X O, so the product does not depend on the choice of
    F): one eigendecomposition of G, no inverse of A or Sigma.
    """
    M = root.T @ A @ root
    G = M @ M.T
    G = (G + G.T) / 2
    if G.shape == (2, 2):  # closed forms: no eigendecomposition (see `sym_sqrt`)
        eye = jnp.eye(2, dtype=G.dtype)
        W = eye + sym_sqrt(eye + 4 * G)  # >= 2 I: a well-conditioned inverse
        X = 2 * inverse(W)
    else:
        gam, U = safe_eigh(G)
        X = (U * (2 / (1 + jnp.sqrt(1 + 4 * jnp.maximum(gam, 0))))[None, :]) @ U.T
    return root @ X @ root.T @ A


@register("sinkhorn")
class SinkhornAttention(AbstractAttention):
    """Sinkhorn attention: the kernel is made doubly stochastic w.r.t. mu.

    k_inf(x, y) = exp(l(x, y) + f(x) + g(y)) with int k_inf(x, y) dmu(y) = 1 and
    int k_inf(x, y) dmu(x) = 1, and Gamma_mu(x) = int k_inf(x, y) V y dmu(y). Log-domain
    iterations start with the row normalisation (which alone is softmax attention);
    `max_iter` counts the column normalisations after it, each followed by a row
    normalisation, so `max_iter=0` is exactly softmax attention.
    Stopping rule: max_j |g_j^new - g_j| < tol, which bounds the column-marginal error
    by about tol. Gradients use implicit differentiation of the fixed point
    (optimistix), not unrolling.

    Kernel "dot": l(x, y) = <A x, y>. Kernel "l2": l(x, y) = -|Q x - K y|^2 (needs Q
    and K); it has the same limit as "dot" with A replaced by 2 K^T Q.

    See [Sinkhorn attention][math-sinkhorn] for the iterations and
    [Gaussians][math-gaussian-sinkhorn] for its closed form on a Gaussian.

    Args:
        V: value matrix (d, d), or a function of t.
        A: (d, d); give either A or both Q and K.
        Q: (k, d).
        K: (k, d).
        kernel: "dot" or "l2".
        max_iter: maximum number of Sinkhorn iterations (>= 0).
        tol: stopping tolerance on the potentials; None means 1e-10 in float64 and
            1e-5 in float32 (about 100 ulps).
        blocking: "auto" (blocked above 2048^2 pairs), "dense" or "blocked": the
            row/column log-sum-exp passes and the final average run on `_blocked`
            (O(block_size^2) memory), and the implicit adjoint uses matrix-free
            GMRES instead of a dense solve.
        block_size: keys per block of the blocked kernel (queries: 4x as many).

    Raises:
        ValueError: unknown kernel, bad parameters, or a `MaskedParticles` measure
            (the only causal doubly stochastic kernel is the identity).
    """

    V: Param
    A: Param | None
    Q: Param | None
    K: Param | None
    kernel: str = eqx.field(static=True)
    max_iter: int = eqx.field(static=True)
    tol: float | None = eqx.field(static=True)
    blocking: str = eqx.field(static=True)
    block_size: int = eqx.field(static=True)
    # Rows of k_inf are probability vectors against mu: |Gamma_mu(x)| <= |V|_2 R.
    normalised: ClassVar[bool] = True

    def __init__(
        self,
        V: ParamLike,
        *,
        A: ParamLike | None = None,
        Q: ParamLike | None = None,
        K: ParamLike | None = None,
        kernel: str = "dot",
        max_iter: int = 1000,
        tol: float | None = None,
        blocking: str = "auto",
        block_size: int = 512,
    ):
        if kernel not in _KERNELS:
            raise ValueError(f"`kernel` must be one of {_KERNELS}; got {kernel!r}.")
        if kernel == "l2" and A is not None:
            raise ValueError('kernel="l2" needs `Q` and `K` (k(x,y) = e^{-|Qx-Ky|^2}).')
        if int(max_iter) != max_iter or max_iter < 0:
            raise ValueError(f"`max_iter` must be an integer >= 0; got {max_iter!r}.")
        if tol is not None and not tol > 0:
            raise ValueError(f"`tol` must be positive; got {tol!r}.")
        self.V, self.A, self.Q, self.K = init_params(V, A, Q, K, "SinkhornAttention")
        self.kernel, self.max_iter, self.tol = kernel, int(max_iter), tol
        # No fused Sinkhorn kernel: its passes are log-sum-exps, not averages.
        self.blocking, self.block_size = check_blocking(
            blocking, block_size, ("auto", "dense", "blocked")
        )

    def _logit_features(self, z, x, t):
        q, keys = bilinear_features(self.A, self.Q, self.K, t, z, x)
        # In the tokens' dtype: float64 parameters must not promote a float32
        # measure (the fixed point's state keeps the measure's dtype).
        q, keys = q.astype(z.dtype), keys.astype(z.dtype)
        if self.kernel == "l2":
            # -|Qz|^2 is a row constant and is absorbed by f; keep -|Kx|^2 as a bias.
            return 2 * q, keys, -jnp.sum(keys**2, axis=-1)
        return q, keys, None

    def potentials(self, measure: AbstractParticles, *, t=0.0) -> SinkhornPotentials:
        """Solve for the Sinkhorn potentials (f, g) of the self-coupling of `measure`.

        Args:
            measure: `Particles` (masked measures are not supported).
            t: time (for time-dependent parameters).

        Returns:
            `SinkhornPotentials` with convergence information.
        """
        if isinstance(measure, MaskedParticles):
            raise ValueError(
                "SinkhornAttention does not support MaskedParticles: a causal "
                "(lower-triangular) doubly stochastic kernel is the identity."
            )
        if not isinstance(measure, AbstractParticles):
            raise ValueError(
                f"`measure` must be `Particles`; got {type(measure).__name__}."
            )
        dtype = _kernels.compute_dtype(measure.x.dtype)
        x = measure.x.astype(dtype)
        w = measure.weights.astype(dtype)
        log_w = _kernels.log_weights(w)
        q, keys, bias = self._logit_features(x, x, t)
        n = x.shape[0]
        if use_blocked(self.blocking, n, n):
            block = self.block_size
            kernel = (q, keys, jnp.zeros((n,), dtype) if bias is None else bias)
            # (I - dT) is applied matrix-free; a dense solve would form n x n.
            adjoint = optx.ImplicitAdjoint(lx.GMRES(rtol=1e-10, atol=1e-10))
        else:
            block, kernel = None, _kernels.logits(q, keys, bias)
            adjoint = optx.ImplicitAdjoint()
        tol = self.tol
        if tol is None:
            tol = 1e-10 if dtype == jnp.float64 else 1e-5
        g = jnp.zeros_like(w)
        if self.max_iter > 0:
            sol = optx.fixed_point(
                _step(block),
                optx.FixedPointIteration(
                    # optimistix keeps its error in the default float dtype; a
                    # float32 state under x64 needs the tolerance there too.
                    rtol=0.0,
                    atol=jnp.asarray(tol, jnp.result_type(float)),
                    norm=optx.max_norm,
                ),
                g,
                args=(kernel, log_w, w),
                max_steps=self.max_iter,
                adjoint=adjoint,
                throw=False,
            )
            g, iterations = sol.value, sol.stats["num_steps"]
            converged = sol.result == optx.RESULTS.successful
        else:
            iterations, converged = jnp.array(0), jnp.array(False)
        f = _row_potential(kernel, g, log_w, block)
        # Column sums of exp(l + f + g) with weights: exp(g_j - (column potential)_j).
        col_sums = jnp.exp(g - _column_potential(kernel, f, log_w, block))
        marginal_error = jax.lax.stop_gradient(
            jnp.max(jnp.where(w > 0, jnp.abs(col_sums - 1), 0))
        )
        # Logits past the dtype's range (tokens near sqrt(max float)) give NaN
        # potentials: an infinite error, never a NaN one, and not converged.
        marginal_error = jnp.where(jnp.isnan(marginal_error), jnp.inf, marginal_error)
        return SinkhornPotentials(f, g, iterations, marginal_error, converged)

    def _evaluate(self, measure, z, positions, t):
        pot = self.potentials(measure, t=t)
        dtype = _kernels.compute_dtype(z.dtype)
        x = measure.x.astype(dtype)
        q, keys, bias = self._logit_features(z.astype(dtype), x, t)
        bias = (
            pot.g
            + _kernels.log_weights(measure.weights.astype(dtype))
            + (0 if bias is None else bias)
        )
        # Gamma(z) = sum_j w_j e^{l(z,x_j) + f(z) + g_j} V x_j, with f(z) the row
        # normalisation: a softmax with per-key bias g_j + log w_j.
        vel = softmax_average(
            q,
            keys,
            bias,
            values_at(self.V, t, x),
            blocking=self.blocking,
            block_size=self.block_size,
        )
        # max_iter = 0 is softmax by definition, not a convergence failure.
        ok = pot.converged if self.max_iter > 0 else jnp.array(True)
        return vel, ok

    def gaussian_field(self, mean, cov, t):
        """B = V S^T Sigma^{-1}, b = V alpha - B alpha (Sander et al.).

        Derivation: docs/math/gaussians.md. S is the cross-covariance of the
        entropic self-coupling of N(alpha, Sigma) (`sinkhorn_gain`); kernel "l2"
        has the limit of "dot" with A -> 2 K^T Q.
        """
        return self._gain_field(mean, sym_sqrt(cov), t)

    def gaussian_field_graded(self, mean, frame, scales, unit, t):
        """As `gaussian_field`, with the root F = Q diag(r) U of the factors.

        The symmetric square root of a formed Sigma carries its small eigenvalues
        with errors ~ (eps |Sigma|)^{1/2}; F carries them exactly.
        """
        return self._gain_field(mean, frame @ (scales[:, None] * unit), t)

    def _gain_field(self, mean, root, t):
        """(B, b) from a root F of Sigma (F F^T = Sigma)."""
        d = mean.shape[0]
        V = param_at(self.V, t, "V", (d, d))
        A = interaction_matrix(self, t, d)
        if self.kernel == "l2":
            A = 2 * A
        B = V @ sinkhorn_gain(A, root)
        return B, V @ mean - B @ mean
