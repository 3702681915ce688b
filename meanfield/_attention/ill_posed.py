"""Ill-posed (unnormalised) attention kernels: counterexamples to well-posedness.

Gamma_mu(x) = int k(x, y) V y dmu(y) with no normalisation. These violate
sup |Gamma_mu| <= |V| R and may blow up in finite time (Castin et al., 2025): the
exponential kernel does for A = V = I and tokens close to each other.
"""

import abc
from typing import ClassVar

import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, ArrayLike

from .._checks import is_traced
from .._custom_types import Param, ParamLike
from .._kernels import dense as _kernels
from .base import (
    AbstractAttention,
    bilinear_features,
    init_params,
    key_positions,
    param_at,
    values_at,
)
from .registry import register


class AbstractIllPosedAttention(AbstractAttention):
    """Unnormalised kernel attention on the bilinear score s = <A x, y>.

    See [Unnormalised kernels][math-unnormalised]: nothing bounds the field, and the
    dynamics can blow up in finite time.
    """

    V: Param
    A: Param | None
    Q: Param | None
    K: Param | None
    # No normalisation: |Gamma_mu| grows with the kernel, no support bound holds.
    normalised: ClassVar[bool] = False

    def __init__(
        self,
        V: ParamLike,
        *,
        A: ParamLike | None = None,
        Q: ParamLike | None = None,
        K: ParamLike | None = None,
    ):
        self.V, self.A, self.Q, self.K = init_params(V, A, Q, K, type(self).__name__)

    @abc.abstractmethod
    def _kernel_sum(self, scores, weights, values, mask):
        """sum_j w_j k(scores_ij) values_j over visible keys, shape (m, d)."""

    def _evaluate(self, measure, z, positions, t):
        x = measure.x
        q, keys = bilinear_features(self.A, self.Q, self.K, t, z, x)
        mask = _kernels.causal_mask(positions, key_positions(measure))
        vel = self._kernel_sum(
            _kernels.logits(q, keys, None),
            measure.weights,
            values_at(self.V, t, x),
            mask,
        )
        return vel, jnp.array(True)


@register("unnormalized")
class UnnormalizedAttention(AbstractIllPosedAttention):
    """k(x, y) = exp(<A x, y> + c), no normalisation (evaluated in log-sum-exp form).

    The constant c = `log_scale` is a factor e^c of the field kept in the exponent:
    the metastable scaling V = e^{-beta} I with A = beta I is `V = I,
    log_scale=-beta`, which stays in float64 range for any beta (e^{-beta} is 0
    past beta = 745, e^beta inf past 709.8).

    See [Unnormalised kernels][math-unnormalised].

    Args:
        V: value matrix (d, d), or a function of t.
        A: interaction matrix (d, d) (or Q and K, (k, d) each).
        Q: query matrix.
        K: key matrix.
        log_scale: c, a finite scalar (default 0).

    Raises:
        ValueError: as every bilinear family; `log_scale` not a finite scalar.
    """

    log_scale: Array

    def __init__(
        self,
        V: ParamLike,
        *,
        A: ParamLike | None = None,
        Q: ParamLike | None = None,
        K: ParamLike | None = None,
        log_scale: ArrayLike = 0.0,
    ):
        super().__init__(V, A=A, Q=Q, K=K)
        c = jnp.asarray(log_scale)
        if c.ndim != 0 or jnp.issubdtype(c.dtype, jnp.complexfloating):
            raise ValueError(f"`log_scale` must be a real scalar; got {log_scale!r}.")
        c = (
            c.astype(jnp.result_type(float))
            if jnp.issubdtype(c.dtype, jnp.integer)
            else c
        )
        if not is_traced(c) and not np.isfinite(float(c)):
            raise ValueError(f"`log_scale` must be finite; got {log_scale!r}.")
        self.log_scale = c

    def _kernel_sum(self, scores, weights, values, mask):
        # In the scores' dtype: a float64 c must not promote float32 tokens.
        c = self.log_scale.astype(scores.dtype)
        return _kernels.exp_kernel_sum(
            scores + c, _kernels.log_weights(weights), values, mask
        )

    def sphere_velocity(self, measure, t=0.0):
        """P^perp_{x_i} Gamma_mu(x_i) from differences x_j - x_i (`exp_kernel_tangent`).

        See [The sphere model][math-sphere].
        """
        x = measure.x
        d = x.shape[-1]
        q, keys = bilinear_features(self.A, self.Q, self.K, t, x, x)
        positions = key_positions(measure)
        scores = _kernels.logits(q, keys, None) + self.log_scale.astype(x.dtype)
        return _kernels.exp_kernel_tangent(
            scores,
            _kernels.log_weights(measure.weights),
            x,
            param_at(self.V, t, "V", (d, d)).astype(x.dtype),
            _kernels.causal_mask(positions, positions),
        )


@register("linear")
class LinearAttention(AbstractIllPosedAttention):
    """k(x, y) = <A x, y>.

    See [Unnormalised kernels][math-unnormalised].
    """

    def _kernel_sum(self, scores, weights, values, mask):
        return _kernels.kernel_sum(scores, weights, values, mask)


@register("relu")
class ReLUAttention(AbstractIllPosedAttention):
    """k(x, y) = ReLU(<A x, y>).

    See [Unnormalised kernels][math-unnormalised].
    """

    def _kernel_sum(self, scores, weights, values, mask):
        return _kernels.kernel_sum(jax.nn.relu(scores), weights, values, mask)


@register("sigmoid")
class SigmoidAttention(AbstractIllPosedAttention):
    """k(x, y) = sigmoid(<A x, y>).

    See [Unnormalised kernels][math-unnormalised].
    """

    def _kernel_sum(self, scores, weights, values, mask):
        return _kernels.kernel_sum(jax.nn.sigmoid(scores), weights, values, mask)
