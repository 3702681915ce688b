"""Softmax attention with positional encodings, on `MaskedParticles`.

Positions s in [0, 1] are the mean-field limit of token indices (s_i = i / n),
and the causal mask keeps s_j <= s_i. Two encodings of the relative position:

    ALiBi  l_ij = <A x_i, x_j> - slope (s_i - s_j)    (Press et al., 2022)
    RoPE   l_ij = <Q x_i, R(s_j - s_i) K x_j>          (Su et al., 2021)

and the variant of ALiBi whose positional weights alone are normalised
(`UnnormalizedALiBiAttention`, Duerinckx, Geshkovski & Rossi).

with R(phi) the block-diagonal rotation by the angles omega_p phi on the
coordinate pairs (2p, 2p + 1). A discrete slope m per index step is slope = m n;
a discrete frequency theta per index step is omega = theta n.

See [Positional attention][math-positional].
"""

from typing import ClassVar

import equinox as eqx
import jax
import jax.numpy as jnp

from .._checks import as_float_array
from .._custom_types import Param, ParamLike
from .._kernels import dense as _kernels
from .._params import as_param
from .base import (
    AbstractAttention,
    AbstractKernelAttention,
    bilinear_features,
    check_blocking,
    init_params,
    key_positions,
    param_at,
    values_at,
)
from .registry import register


def _needs_positions(cls_name: str) -> ValueError:
    return ValueError(
        f"{cls_name} needs token positions: pass `MaskedParticles(x, positions)`."
    )


def _check_slope(slope) -> Param:
    slope = as_param(slope, "slope")
    if not callable(slope) and slope.shape != ():
        raise ValueError(f"`slope` must be a number; got shape {slope.shape}.")
    return slope


@register("alibi")
class ALiBiAttention(AbstractKernelAttention):
    """Causal softmax attention with the ALiBi bias -slope (s_i - s_j).

    Gamma(x_i) = sum_{s_j <= s_i} w_j e^{<A x_i, x_j> + slope s_j} V x_j / Z_i:
    the query's own -slope s_i is the same for every key and cancels in the
    normalisation, so the bias is a per-key one and the dense, blocked and fused
    kernels all apply. A slope > 0 favours recent tokens.

    Args:
        V: value matrix (d, d), or a function of t.
        A: interaction matrix (d, d); give either A or both Q and K.
        Q: query matrix (k, d).
        K: key matrix (k, d).
        slope: the bias per unit of position (a number or a function of t);
            the discrete ALiBi slope m per token is slope = m n.
        blocking: "auto", "dense", "blocked" or "fused", as for softmax.
        block_size: keys per block of the blocked kernel.

    Raises:
        ValueError: both or neither of A and (Q, K); shapes that do not match;
            (at evaluation) a measure without positions.
    """

    V: Param
    A: Param | None
    Q: Param | None
    K: Param | None
    slope: Param
    blocking: str = eqx.field(static=True)
    block_size: int = eqx.field(static=True)

    def __init__(
        self,
        V: ParamLike,
        *,
        A: ParamLike | None = None,
        Q: ParamLike | None = None,
        K: ParamLike | None = None,
        slope: ParamLike,
        blocking: str = "auto",
        block_size: int = 512,
    ):
        self.V, self.A, self.Q, self.K = init_params(V, A, Q, K, "ALiBiAttention")
        self.slope = _check_slope(slope)
        self.blocking, self.block_size = check_blocking(blocking, block_size)

    def features(self, z, x, t):
        """(A z, x, None): the bilinear part of the logits."""
        q, keys = bilinear_features(self.A, self.Q, self.K, t, z, x)
        return q, keys, None

    def positional_bias(self, query_pos, key_pos, t):
        """The bias slope s_j (the query's -slope s_i cancels in the softmax)."""
        if key_pos is None:
            raise _needs_positions("ALiBiAttention")
        return param_at(self.slope, t, "slope", ()) * key_pos


@register("rope")
class RoPEAttention(AbstractKernelAttention):
    """Causal softmax attention with rotary position encoding.

    l_ij = <R(s_i) Q x_i, R(s_j) K x_j> = <Q x_i, R(s_j - s_i) K x_j>, R(phi) the
    rotation by omega_p phi of the coordinate pairs (2p, 2p + 1) of R^k.

    Args:
        V: value matrix (d, d), or a function of t.
        Q: query matrix (k, d), k even.
        K: key matrix (k, d).
        frequencies: omega, shape (k / 2,) (or a function of t); a discrete
            frequency theta per token is omega = theta n.
        blocking: "auto", "dense", "blocked" or "fused", as for softmax.
        block_size: keys per block of the blocked kernel.

    Raises:
        ValueError: shapes that do not match (k odd, omega not of length k / 2);
            (at evaluation) a measure without positions.
    """

    V: Param
    Q: Param
    K: Param
    frequencies: Param
    blocking: str = eqx.field(static=True)
    block_size: int = eqx.field(static=True)

    def __init__(
        self,
        V: ParamLike,
        *,
        Q: ParamLike,
        K: ParamLike,
        frequencies: ParamLike,
        blocking: str = "auto",
        block_size: int = 512,
    ):
        self.V, _, self.Q, self.K = init_params(V, None, Q, K, "RoPEAttention")
        self.frequencies = as_param(frequencies, "frequencies")
        if not callable(self.Q):
            k = self.Q.shape[0]
            if k % 2:
                raise ValueError(
                    f"`Q` and `K` must have an even number of rows k; got k = {k}."
                )
            if not callable(self.frequencies) and self.frequencies.shape != (k // 2,):
                raise ValueError(
                    f"`frequencies` must have shape (k/2,) = ({k // 2},); got "
                    f"{as_float_array(self.frequencies, 'frequencies').shape}."
                )
        self.blocking, self.block_size = check_blocking(blocking, block_size)

    def features(self, z, x, t):
        """Without positions there is no rotary encoding."""
        raise _needs_positions("RoPEAttention")

    def positional_features(self, z, x, query_pos, key_pos, t):
        """(R(s_i) Q z_i, R(s_j) K x_j, None)."""
        if key_pos is None:
            raise _needs_positions("RoPEAttention")
        q, keys = bilinear_features(None, self.Q, self.K, t, z, x)
        omega = param_at(self.frequencies, t, "frequencies", (q.shape[-1] // 2,))
        return rotate(q, query_pos, omega), rotate(keys, key_pos, omega), None


def rotate(u, s, omega):
    """Rows u_i (m, k) rotated by R(s_i): angles omega_p s_i on pairs (2p, 2p+1)."""
    angle = s[:, None] * omega[None, :]
    cos, sin = jnp.cos(angle), jnp.sin(angle)
    even, odd = u[:, 0::2], u[:, 1::2]
    rotated = jnp.stack([cos * even - sin * odd, sin * even + cos * odd], axis=-1)
    return rotated.reshape(u.shape)


@register("unnormalized_alibi")
class UnnormalizedALiBiAttention(AbstractAttention):
    """Causal attention whose ALiBi weights are normalised and whose kernel is not.

    Gamma(x_i) = sum_j pi_ij e^{<A x_i, x_j>} V x_j, with positional weights
    pi_ij = w_j e^{-slope (s_i - s_j)} / sum_j' w_j' e^{-slope (s_i - s_j')} over
    the visible keys: the model of Duerinckx, Geshkovski & Rossi (arXiv
    2605.09213), whose token kernel e^{<A x, y>} is not normalised (on S^1 with
    A = V = beta I it is their theta_i' = sum_j pi_ij beta sin(theta_j - theta_i)
    e^{beta cos(theta_i - theta_j)}). Like the unnormalised kernels, nothing bounds
    the field. Dense evaluation ((m, n) memory).

    Args:
        V: value matrix (d, d), or a function of t.
        A: interaction matrix (d, d); give either A or both Q and K.
        Q: query matrix (k, d).
        K: key matrix (k, d).
        slope: the ALiBi slope per unit of position (a number or a function of t).
        include_self: whether a token sees the keys at its own position (s_j <=
            s_i, the mask of `MaskedParticles`) or only earlier ones (s_j < s_i,
            as the discrete model of the paper, which leaves a token out of its
            own sum). A query that sees no key gets 0.

    Raises:
        ValueError: as `ALiBiAttention`.
    """

    V: Param
    A: Param | None
    Q: Param | None
    K: Param | None
    slope: Param
    include_self: bool = eqx.field(static=True)
    # No normalisation of the kernel: no support bound holds.
    normalised: ClassVar[bool] = False

    def __init__(
        self,
        V: ParamLike,
        *,
        A: ParamLike | None = None,
        Q: ParamLike | None = None,
        K: ParamLike | None = None,
        slope: ParamLike,
        include_self: bool = True,
    ):
        name = "UnnormalizedALiBiAttention"
        self.V, self.A, self.Q, self.K = init_params(V, A, Q, K, name)
        self.slope = _check_slope(slope)
        self.include_self = bool(include_self)

    def _scores(self, measure, z, positions, t):
        """(scores l_ij - log D_i (m, n), log w, mask): sum_j w_j e^{scores} = field."""
        key_pos = key_positions(measure)
        if key_pos is None:
            raise _needs_positions("UnnormalizedALiBiAttention")
        x = measure.x
        q, keys = bilinear_features(self.A, self.Q, self.K, t, z, x)
        relative = param_at(self.slope, t, "slope", ()) * (
            key_pos[None, :] - positions[:, None]
        )
        if self.include_self:
            mask = key_pos[None, :] <= positions[:, None]
        else:
            mask = key_pos[None, :] < positions[:, None]
        log_w = _kernels.log_weights(measure.weights)
        # log D_i = log sum_j w_j e^{-slope (s_i - s_j)} over visible keys; a row
        # that sees nothing gets 0 (its kernel is masked out anyway).
        log_d = jax.nn.logsumexp(
            jnp.where(mask, relative + log_w[None, :], -jnp.inf), axis=1
        )
        log_d = jnp.where(jnp.isfinite(log_d), log_d, 0)
        scores = _kernels.logits(q, keys, None) + relative - log_d[:, None]
        return scores, log_w, mask

    def _evaluate(self, measure, z, positions, t):
        scores, log_w, mask = self._scores(measure, z, positions, t)
        values = values_at(self.V, t, measure.x)
        return _kernels.exp_kernel_sum(scores, log_w, values, mask), jnp.array(True)

    def sphere_velocity(self, measure, t=0.0):
        """The tangential field from differences x_j - x_i (`exp_kernel_tangent`)."""
        x = measure.x
        scores, log_w, mask = self._scores(measure, x, measure.positions, t)
        V = param_at(self.V, t, "V", (x.shape[-1],) * 2).astype(x.dtype)
        return _kernels.exp_kernel_tangent(scores, log_w, x, V, mask)
