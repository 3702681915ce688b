"""Ill-posed (unnormalised) attention kernels: counterexamples to well-posedness.

Gamma_mu(x) = int k(x, y) V y dmu(y) with no normalisation. These violate
sup |Gamma_mu| <= |V| R and may blow up in finite time (Castin et al., 2025): the
exponential kernel does for A = V = I and tokens close to each other.
"""

import abc
from typing import ClassVar

import jax
import jax.numpy as jnp

from .._custom_types import Param, ParamLike
from .._kernels import dense as _kernels
from .base import (
    AbstractAttention,
    bilinear_features,
    init_params,
    key_positions,
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
    """k(x, y) = exp(<A x, y>), no normalisation (evaluated in log-sum-exp form).

    See [Unnormalised kernels][math-unnormalised].
    """

    def _kernel_sum(self, scores, weights, values, mask):
        return _kernels.exp_kernel_sum(
            scores, _kernels.log_weights(weights), values, mask
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
