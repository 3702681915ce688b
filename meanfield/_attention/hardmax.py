"""Hardmax attention: each token moves towards the keys it scores highest.

Gamma_mu(x) = sum_{j in S(x)} w_j V x_j / sum_{j in S(x)} w_j with
S(x) = argmax_j <A x, x_j>, the beta -> inf limit of softmax attention with A
replaced by beta A (Alcalde, Fantuzzi & Zuazua, 2024: the tokens of S(x) are the
"leaders" of x). Ties share the attention in proportion to the weights (equally
for uniform ones); logits within rounding of the maximum tie (`_kernels.argmax`).

See [Hardmax attention][math-hardmax].
"""

from typing import ClassVar

import equinox as eqx
import jax.numpy as jnp

from .._custom_types import Param, ParamLike
from .._kernels import argmax as _argmax
from .._kernels import dense as _kernels
from .._linalg import power_of_two_scale
from .base import (
    QUERY_BLOCKS,
    AbstractAttention,
    bilinear_features,
    check_blocking,
    init_params,
    key_positions,
    use_blocked,
    values_at,
)
from .registry import register


@register("hardmax")
class HardmaxAttention(AbstractAttention):
    """Hardmax attention: the weighted mean of V x_j over the maximisers of <A x, x_j>.

    The selection is piecewise constant in the tokens: derivatives flow through
    the values V x_j of the selected keys only (the a.e. derivative).

    Args:
        V: value matrix (d, d), or a function of t.
        A: interaction matrix (d, d); give either A or both Q and K.
        Q: query matrix (k, d).
        K: key matrix (k, d).
        blocking: "auto" (blocked above 2048^2 query-key pairs), "dense" or
            "blocked" (O(block_size^2) memory).
        block_size: keys per block of the blocked kernel (queries: 4x as many).

    Raises:
        ValueError: both or neither of A and (Q, K); shapes that do not match.
    """

    V: Param
    A: Param | None
    Q: Param | None
    K: Param | None
    blocking: str = eqx.field(static=True)
    block_size: int = eqx.field(static=True)
    # An average of values: |Gamma_mu(x)| <= |V|_2 R on B_R.
    normalised: ClassVar[bool] = True

    def __init__(
        self,
        V: ParamLike,
        *,
        A: ParamLike | None = None,
        Q: ParamLike | None = None,
        K: ParamLike | None = None,
        blocking: str = "auto",
        block_size: int = 512,
    ):
        self.V, self.A, self.Q, self.K = init_params(V, A, Q, K, "HardmaxAttention")
        self.blocking, self.block_size = check_blocking(
            blocking, block_size, ("auto", "dense", "blocked")
        )

    def _evaluate(self, measure, z, positions, t):
        dtype = _kernels.compute_dtype(z.dtype)
        x, z = measure.x.astype(dtype), z.astype(dtype)
        # The selection is invariant under scaling the tokens: features of the
        # tokens divided by a power of two keep logits of huge tokens finite.
        c = power_of_two_scale(jnp.concatenate([x, z]), jnp.finfo(dtype).maxexp // 4)
        q, keys = bilinear_features(self.A, self.Q, self.K, t, z / c, x / c)
        args = (
            q,
            keys,
            measure.weights.astype(dtype),
            values_at(self.V, t, x),
            positions,
            key_positions(measure),
        )
        if use_blocked(self.blocking, z.shape[0], x.shape[0]):
            vel = _argmax.blocked_average(
                *args,
                block_q=QUERY_BLOCKS * self.block_size,
                block_k=self.block_size,
            )
        else:
            vel = _argmax.dense_average(*args)
        return vel, jnp.array(True)
