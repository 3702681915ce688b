"""Attention interfaces and the shared bilinear parametrisation.

Parameters follow Castin et al.: Q, K in R^{k x d} (or A = K^T Q in R^{d x d}) and
V in R^{d x d}, so <Q x, K y> = <A x, y>. Each may be an array or a function of t.
"""

import abc
from typing import ClassVar

import equinox as eqx
import jax.numpy as jnp
from jaxtyping import Array, ArrayLike, Bool, Float

from .._checks import as_float_array, check_finite, format_shape, shape_matches
from .._custom_types import Param
from .._kernels import blocked as _blocked
from .._kernels import bounded as _bounded
from .._kernels import dense as _kernels
from .._linalg import power_of_two_scale
from .._measures import AbstractMeasure, AbstractParticles, MaskedParticles
from .._params import as_param, at

#: How the (m, n) query-key interactions are evaluated.
BLOCKING = ("auto", "dense", "blocked", "fused")
#: "auto" switches to the blocked kernel above this many pairs m n (2048^2): below
#: it the dense kernel is as fast or faster on CPU, above it the dense one becomes
#: memory-bound (measurements in benchmarks/README.md). Above it, unmasked logits of
#: at most `_bounded.MAX_FEATURES` features go through the kernel of bounded logits
#: (`_kernels.bounded`: one exponential per pair, no running maximum), the online
#: softmax being its fallback for logits too large for it.
AUTO_BLOCKED_PAIRS = 2048 * 2048
#: Query blocks are this many key blocks tall: a (2048, 512) tile ran 1.2x faster
#: than (512, 512) at n = 16384, d = 16 on CPU (fewer passes over the keys).
QUERY_BLOCKS = 4


def check_blocking(
    blocking: str, block_size: int, options: tuple[str, ...] = BLOCKING
) -> tuple[str, int]:
    """Validate the `blocking` / `block_size` options of an attention."""
    if blocking not in options:
        raise ValueError(f"`blocking` must be one of {options}; got {blocking!r}.")
    if int(block_size) != block_size or block_size < 1:
        raise ValueError(f"`block_size` must be an integer >= 1; got {block_size!r}.")
    return blocking, int(block_size)


def use_blocked(blocking: str, m: int, n: int) -> bool:
    """Whether an (m queries) x (n keys) evaluation runs blocked."""
    if blocking == "auto":
        return m * n > AUTO_BLOCKED_PAIRS
    return blocking in ("blocked", "fused")


def use_bounded(features: int, query_pos) -> bool:
    """Whether "auto" tries the kernel of bounded logits on large inputs.

    Unmasked, with at most `_bounded.MAX_FEATURES` features per query: at d = 2,
    n = 2^14..2^17 it ran 1.5-1.9x faster than the online softmax on a 2-core CPU
    (docs/benchmarks.md); at d = 16, n = 16384 it was within 3 % of it, so larger
    features keep the online softmax.
    """
    return query_pos is None and features <= _bounded.MAX_FEATURES


def softmax_average(
    q,
    keys,
    bias,
    values,
    query_pos=None,
    key_pos=None,
    *,
    blocking,
    block_size,
    logit_scale=None,
) -> Float[Array, "m dv"]:
    """sum_j softmax_j(c^2 (<q_i, k_j> + b_j)) v_j (over s_j <= s_i), dense or blocked.

    Large unmasked inputs of few features under "auto" take `_kernels.bounded`
    (falling back to the online softmax of `_blocked` where the logits are large).
    c = `logit_scale` (None: 1) is a power of two that brings logits too large for
    the dtype back from scaled features (`_kernels.softmax_average`).
    """
    if blocking == "fused":
        # One Pallas kernel (Triton on a GPU, interpreted elsewhere), imported on
        # use: `import meanfield` does not load Pallas.
        from .._kernels import fused

        return fused.softmax_average(
            q, keys, bias, values, query_pos, key_pos, logit_scale=logit_scale
        )
    if use_blocked(blocking, q.shape[0], keys.shape[0]):

        def online():
            return _blocked.softmax_average(
                q,
                keys,
                bias,
                values,
                query_pos,
                key_pos,
                block_q=QUERY_BLOCKS * block_size,
                block_k=block_size,
                logit_scale=logit_scale,
            )

        if blocking == "auto" and use_bounded(q.shape[1], query_pos):
            return _bounded.softmax_average(
                q, keys, bias, values, fallback=online, logit_scale=logit_scale
            )
        return online()
    mask = _kernels.causal_mask(query_pos, key_pos)
    return _kernels.softmax_average(
        _kernels.logits(q, keys, bias), values, mask, logit_scale=logit_scale
    )


def check_bilinear_args(A, Q, K, cls_name: str) -> None:
    """Exactly one of `A` or the pair (`Q`, `K`) must be given."""
    if A is not None and (Q is not None or K is not None):
        raise ValueError(f"{cls_name}: pass either `A` or both `Q` and `K`, not both.")
    if A is None and (Q is None or K is None):
        raise ValueError(
            f"{cls_name}: pass either `A` (d, d) or both `Q` and `K` (k, d)."
        )


def param_at(param, t, name: str, shape: tuple) -> Float[Array, "..."]:
    """Evaluate `param` at t and check its shape (None entries match anything)."""
    value = at(param, t, name)
    if not shape_matches(value.shape, shape):
        raise ValueError(
            f"`{name}` must have shape {format_shape(shape, 'k')} for tokens of "
            f"dimension d = {shape[-1]}; got shape {value.shape}."
        )
    return value


def bilinear_features(
    A, Q, K, t, z, x
) -> tuple[Float[Array, "m k"], Float[Array, "n k"]]:
    """(q, keys) with <q_i, keys_j> = <A z_i, x_j> = <Q z_i, K x_j>."""
    d = x.shape[-1]
    if A is not None:
        return z @ param_at(A, t, "A", (d, d)).T, x
    q = param_at(Q, t, "Q", (None, d))
    k = param_at(K, t, "K", (q.shape[0], d))
    return z @ q.T, x @ k.T


def interaction_matrix(attn, t, d: int) -> Float[Array, "d d"]:
    """A = K^T Q at time t (or the given A)."""
    if getattr(attn, "A", None) is not None:
        return param_at(attn.A, t, "A", (d, d))
    Q = param_at(attn.Q, t, "Q", (None, d))
    K = param_at(attn.K, t, "K", (Q.shape[0], d))
    return K.T @ Q


def values_at(V, t, x) -> Float[Array, "n d"]:
    """v_j = V x_j for every atom."""
    d = x.shape[-1]
    return x @ param_at(V, t, "V", (d, d)).T


def _check_array_param(value, name: str, shape: tuple) -> None:
    if value is not None and not callable(value):
        param_at(value, 0.0, name, shape)


def check_param_shapes(V, A=None, Q=None, K=None) -> None:
    """Static shape checks for array parameters at construction (callables at call)."""
    if not callable(V):
        if V.ndim != 2 or V.shape[0] != V.shape[1]:
            raise ValueError(f"`V` must have shape (d, d); got shape {V.shape}.")
        d = V.shape[0]
        _check_array_param(A, "A", (d, d))
        _check_array_param(Q, "Q", (None, d))
    if Q is not None and K is not None and not callable(Q) and not callable(K):
        if Q.ndim != 2 or K.shape != Q.shape:
            raise ValueError(
                f"`Q` and `K` must both have shape (k, d); got {Q.shape} and {K.shape}."
            )


def norm2(M) -> Float[Array, ""]:
    """Spectral norm |M|_2.

    2 x 2: the closed form sigma_max = (|(a + d, c - b)| + |(a - d, b + c)|) / 2 (a sum
    of non-negative terms, so as accurate as the SVD it replaces, and cheaper in a
    batched solve).
    """
    M = jnp.asarray(M)
    if M.shape == (2, 2):
        (a, b), (c, d) = M[0], M[1]
        return (jnp.hypot(a + d, c - b) + jnp.hypot(a - d, b + c)) / 2
    return jnp.linalg.norm(M, ord=2)


class AbstractAttention(eqx.Module):
    """A self-attention velocity field mu -> Gamma_mu.

    Subclasses implement `_evaluate`; the public methods validate inputs once.

    What the analyses (`mf.gaussian`, `mf.lipschitz`, `mf.wasserstein`) know about a
    family lives on its class, so a new family is one module:

    - `normalised` (an abstract class variable: every family declares it, once):
      Gamma_mu(x) is an average of the values V y against a probability kernel,
      hence |Gamma_mu(x)| <= |V|_2 R when mu lives in B_R (the support bound of the
      stability estimate). True for `AbstractKernelAttention` and Sinkhorn, False
      for `AbstractIllPosedAttention`; for multi-head, whether all heads are.
    - Optional formulas, None by default meaning "no such result for this family"
      (as diffrax's `AbstractSolver.order`); a final class overrides only those it
      has: `kernel_constants` (mean-field Lipschitz and Gronwall bounds),
      `lipschitz_growth` (finite-n Lipschitz bound), `gaussian_field` and
      `covariance_growth_rate` (Gaussian moment ODE), `sphere_velocity` (the
      tangential field to relative precision at large beta).
    - `flat_heads`: the attention as a sum of single-family heads W_h Gamma_h, the
      one recursion over multi-head attention that every analysis uses.

    See [Velocity fields][math-velocity-fields] for the families, and
    [The support stays bounded][math-bounded-support] for what `normalised` implies.
    """

    normalised: eqx.AbstractClassVar[bool]

    def flat_heads(
        self, t=0.0, d: int | None = None
    ) -> list[tuple["AbstractAttention", Float[Array, "d d"] | None]]:
        """This attention as sum_h W_h Gamma_h over single-family heads Gamma_h.

        Args:
            t: time at which the output matrices are evaluated.
            d: token dimension the output matrices must match, or None (no check).

        Returns:
            [(head, W_h)] with W_h (d, d) the product of the output matrices above
            the head, None for the identity. A single family is its own only head,
            [(self, None)]; `MultiHeadAttention` expands nested heads.
        """
        return [(self, None)]

    def kernel_constants(
        self, t, d: int
    ) -> tuple[Float[Array, ""], Float[Array, ""], Float[Array, ""]] | None:
        """(c_x, c_y, c_o) of the log-kernel phi(x, y) = log k(x, y) at time t.

        For x, y in the ball B_R: |grad_x phi| <= c_x R, |grad_y phi| <= c_y R and
        osc_y phi <= c_o R^2 (derivation in `mf.wasserstein`'s stability module).
        They give the mean-field Lipschitz constant (`mf.lipschitz.meanfield_bound`)
        and the Gronwall bound of `mf.wasserstein.stability`.

        Args:
            t: time of time-dependent parameters.
            d: token dimension.

        Returns:
            The three constants, or None (the default): no bound for this family,
            and those bounds are +inf.
        """
        return None

    def lipschitz_growth(self, n: int, R: float, t, d: int) -> Float[Array, ""] | None:
        """g(n, R) with Lip(f) <= |V|_2 g(n, R) for n tokens in B_R; None if unproved.

        f(X)_i = Gamma_X(x_i) on (R^d)^n (`mf.lipschitz.upper_bound`, which weighs
        each head by |W_h V_h|_2).

        Args:
            n: number of tokens.
            R: radius of the ball holding every token.
            t: time of time-dependent parameters.
            d: token dimension.

        Returns:
            g(n, R), or None (the default): no finite-n bound for this family.
        """
        return None

    def gaussian_field(
        self, mean: Float[Array, " d"], cov: Float[Array, "d d"], t
    ) -> tuple[Float[Array, "d d"], Float[Array, " d"]] | None:
        """(B, b) with Gamma_mu(x) = B x + b on mu = N(mean, cov).

        Derivations: docs/math/gaussians.md.

        Args:
            mean: alpha, shape (d,).
            cov: Sigma, shape (d, d).
            t: time of time-dependent parameters.

        Returns:
            (B (d, d), b (d,)), or None (the default): the field is not affine and
            the family does not keep Gaussians Gaussian (`mf.gaussian` refuses it).
        """
        return None

    def gaussian_field_graded(
        self,
        mean: Float[Array, " d"],
        frame: Float[Array, "d d"],
        scales: Float[Array, " d"],
        unit: Float[Array, "d d"],
        t,
    ) -> tuple[Float[Array, "d d"], Float[Array, " d"]] | None:
        """`gaussian_field` for Sigma = Q diag(r) U U^T diag(r) Q^T, given in factors.

        Q orthogonal (`frame`), r > 0 (`scales`, any spread), U unit upper
        triangular (`unit`). The Gaussian study's frame coordinates keep Sigma so
        (docs/math/blowup.md): its small directions are known to full relative
        precision even when r spans many orders of magnitude. Families whose field
        inverts a Sigma-dependent matrix override this to keep that precision; the
        default forms Sigma, which is exact for fields linear in Sigma (None
        where the family has no Gaussian field).
        """
        R = scales[:, None] * unit
        return self.gaussian_field(mean, frame @ (R @ R.T) @ frame.T, t)

    def sphere_velocity(
        self, measure: AbstractParticles, t=0.0
    ) -> Float[Array, "n d"] | None:
        """P^perp_{x_i} Gamma_mu(x_i) at unit atoms x_i, to relative precision.

        The field of normalization="sphere". Projecting Gamma cancels its radial
        part, which at large beta holds all but ~e^{-beta c} of it: rounding then
        swamps the tangential part. A family that can evaluate the projection
        from differences x_j - x_i (`exp_kernel_tangent`) overrides this.

        Args:
            measure: particles with |x_i| = 1.
            t: time of time-dependent parameters.

        Returns:
            The tangential field (n, d), or None (the default): the caller
            projects `velocity`.
        """
        return None

    def covariance_growth_rate(self, t, d: int) -> Float[Array, ""] | None:
        """r(t) with |Sigma(t)| <= |Sigma(0)| e^{2 int r} for Gaussians, if known.

        Used by `mf.gaussian.simulate` to tell exponential growth from a blow-up.

        Args:
            t: time of time-dependent parameters.
            d: token dimension.

        Returns:
            r(t), or None (the default): |V|_2 is used as the reference rate.
        """
        return None

    @abc.abstractmethod
    def _evaluate(
        self,
        measure: AbstractParticles,
        z: Float[Array, "m d"],
        positions: Float[Array, " m"] | None,
        t,
    ) -> tuple[Float[Array, "m d"], Bool[Array, ""]]:
        """(Gamma_mu(z), ok); ok is False when an inner solver did not converge."""

    def velocity_and_status(
        self,
        measure: AbstractParticles,
        z: ArrayLike | None = None,
        *,
        positions: ArrayLike | None = None,
        t=0.0,
    ) -> tuple[Float[Array, "m d"], Bool[Array, ""]]:
        """Velocity at z (default: the atoms) and whether inner solvers converged.

        Same arguments as `velocity_at`; `z=None` evaluates at the measure's atoms.

        Returns:
            (velocity (m, d), converged: bool scalar). `converged` is False only for
            Sinkhorn attention whose iterations stopped at `max_iter`.
        """
        if z is None:
            if not isinstance(measure, AbstractParticles):
                raise _not_particles(measure)
            z, positions = measure.x, getattr(measure, "positions", None)
        z, positions = _check_queries(measure, z, positions)
        vel, ok = self._evaluate(measure, z, positions, t)
        return vel.astype(z.dtype), ok

    def velocity_at(
        self,
        measure: AbstractParticles,
        z: ArrayLike,
        *,
        positions: ArrayLike | None = None,
        t=0.0,
    ) -> Float[Array, "m d"]:
        """Gamma_mu(z) at arbitrary points.

        Args:
            measure: `Particles` or `MaskedParticles` (the latter selects masking).
            z: query points, shape (m, d).
            positions: query positions s, shape (m,), required for `MaskedParticles`
                (query i sees atom j iff s_j <= positions_i); must be None otherwise.
            t: time (for time-dependent parameters).

        Returns:
            Velocities, shape (m, d).
        """
        return self.velocity_and_status(measure, z, positions=positions, t=t)[0]

    def velocity(self, measure: AbstractParticles, *, t=0.0) -> Float[Array, "n d"]:
        """Gamma_mu at the measure's own atoms, shape (n, d)."""
        return self.velocity_and_status(measure, t=t)[0]


def _not_particles(measure) -> ValueError:
    hint = (
        " For a Gaussian use `mf.gaussian.velocity` or `measure.sample(key, n)`."
        if isinstance(measure, AbstractMeasure)
        else ""
    )
    return ValueError(
        "`measure` must be `Particles` or `MaskedParticles`; "
        f"got {type(measure).__name__}.{hint}"
    )


def _check_queries(measure, z, positions):
    if not isinstance(measure, AbstractParticles):
        raise _not_particles(measure)
    z = as_float_array(z, "z").astype(measure.x.dtype)
    if z.ndim != 2 or z.shape[1] != measure.dim:
        raise ValueError(
            f"`z` must have shape (m, d) with d = {measure.dim} (the measure's "
            f"dimension); got shape {z.shape}."
        )
    if isinstance(measure, MaskedParticles):
        if positions is None:
            raise ValueError(
                "`positions` (m,) of the query points is required for MaskedParticles."
            )
        positions = as_float_array(positions, "positions").astype(z.dtype)
        if positions.shape != (z.shape[0],):
            raise ValueError(
                f"`positions` must have shape (m,) = ({z.shape[0]},); "
                f"got {positions.shape}."
            )
        positions = check_finite(positions, "positions")
    elif positions is not None:
        raise ValueError("`positions` is only meaningful for MaskedParticles; got it.")
    return z, positions


def key_positions(measure) -> Float[Array, " n"] | None:
    """Positions s_j of the atoms (None for unmasked particles)."""
    return measure.positions if isinstance(measure, MaskedParticles) else None


class AbstractKernelAttention(AbstractAttention):
    """Row-normalised attention: Gamma(z_i) = sum_j softmax_j(l_ij + log w_j) V x_j.

    A family only supplies `features(z, x, t) -> (q, keys, key_bias)` with
    l_ij = <q_i, keys_j> + key_bias_j, the log-kernel up to per-row constants.
    The evaluation is dense (one (m, n) logits matrix) or blocked (`_blocked`,
    O(block_size^2) memory, masked key blocks skipped) by `blocking`.

    See [Normalised kernels][math-normalised-kernels] for the derivation and
    [The blocked online softmax][math-online-softmax] for the blocked evaluation.
    """

    V: eqx.AbstractVar[Param]
    blocking: eqx.AbstractVar[str]
    block_size: eqx.AbstractVar[int]
    # Rows of the kernel are probability vectors: |Gamma_mu(x)| <= |V|_2 R on B_R.
    normalised: ClassVar[bool] = True

    @abc.abstractmethod
    def features(
        self, z: Float[Array, "m d"], x: Float[Array, "n d"], t
    ) -> tuple[Float[Array, "m k"], Float[Array, "n k"], Float[Array, " n"] | None]:
        """(q, keys, key_bias): log k(z_i, x_j) = <q_i, keys_j> + key_bias_j."""

    def positional_features(
        self,
        z: Float[Array, "m d"],
        x: Float[Array, "n d"],
        query_pos: Float[Array, " m"] | None,
        key_pos: Float[Array, " n"] | None,
        t,
    ) -> tuple[Float[Array, "m k"], Float[Array, "n k"], Float[Array, " n"] | None]:
        """`features` of a family whose kernel depends on the positions s.

        The default ignores them (the causal mask alone uses positions).
        """
        return self.features(z, x, t)

    def positional_bias(
        self,
        query_pos: Float[Array, " m"] | None,
        key_pos: Float[Array, " n"] | None,
        t,
    ) -> Float[Array, " n"] | None:
        """A per-key logit bias from the positions, in logit units (None: none).

        Unlike `features`' bias it is not quadratic in the tokens, so the logit
        rescaling of large tokens divides it by c^2 rather than the features.
        """
        return None

    def _evaluate(self, measure, z, positions, t):
        dtype = _kernels.compute_dtype(z.dtype)
        x, z = measure.x.astype(dtype), z.astype(dtype)
        key_pos = key_positions(measure)
        # Logits are quadratic in the tokens: past sqrt(max float) they overflow
        # although the weights they give are representable. Features of the
        # tokens divided by a power of two c give logits / c^2 exactly, and the
        # kernel scales the max-shifted logits back (c = 1 for ordinary tokens).
        c = power_of_two_scale(jnp.concatenate([x, z]), jnp.finfo(dtype).maxexp // 4)
        q, keys, bias = self.positional_features(z / c, x / c, positions, key_pos, t)
        log_w = _kernels.log_weights(measure.weights.astype(dtype))
        extra = self.positional_bias(positions, key_pos, t)
        if extra is not None:
            log_w = log_w + extra.astype(dtype)
        log_w = log_w / c / c
        bias = log_w if bias is None else bias + log_w
        vel = softmax_average(
            q,
            keys,
            bias,
            values_at(self.V, t, x),
            positions,
            key_pos,
            blocking=self.blocking,
            block_size=self.block_size,
            logit_scale=c,
        )
        return vel, jnp.array(True)


def init_params(V, A, Q, K, cls_name: str):
    """Convert and check (V, A, Q, K) as a bilinear attention's parameters."""
    check_bilinear_args(A, Q, K, cls_name)
    V, A, Q, K = (as_param(p, n) for p, n in ((V, "V"), (A, "A"), (Q, "Q"), (K, "K")))
    check_param_shapes(V, A, Q, K)
    return V, A, Q, K
