"""Softmax self-attention (as a PDE: Geshkovski et al., 2023; Castin et al., 2025)."""

import equinox as eqx

from .._custom_types import Param, ParamLike
from .base import (
    AbstractKernelAttention,
    bilinear_features,
    check_blocking,
    init_params,
)
from .registry import register


@register("softmax")
class SoftmaxAttention(AbstractKernelAttention):
    """Softmax attention, k(x, y) = e^{<A x, y>} normalised against mu.

    Gamma_mu(x) = int e^{<A x, y>} V y dmu(y) / int e^{<A x, y>} dmu(y).

    Args:
        V: value matrix (d, d), or a function of t.
        A: interaction matrix A = K^T Q (d, d); give either A or both Q and K.
        Q: query matrix (k, d).
        K: key matrix (k, d).
        blocking: "auto" (blocked above 2048^2 query-key pairs), "dense" or
            "blocked" (O(block_size^2) memory, `_blocked`).
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
        self.V, self.A, self.Q, self.K = init_params(V, A, Q, K, "SoftmaxAttention")
        self.blocking, self.block_size = check_blocking(blocking, block_size)

    def features(self, z, x, t):
        """(A z, x, None): log k(z, x) = <A z, x>."""
        q, keys = bilinear_features(self.A, self.Q, self.K, t, z, x)
        return q, keys, None
