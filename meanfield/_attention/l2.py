"""L2 self-attention (Kim, Papamakarios & Mnih, ICML 2021)."""

import equinox as eqx
import jax.numpy as jnp

from .._custom_types import Param, ParamLike
from .base import (
    AbstractKernelAttention,
    bilinear_features,
    check_blocking,
    init_params,
)
from .registry import register


@register("l2")
class L2Attention(AbstractKernelAttention):
    """L2 attention: k(x, y) = exp(-|Q x - K y|^2), row-normalised.

    -|Qx - Ky|^2 = 2<Qx, Ky> - |Ky|^2 - |Qx|^2; the last term is constant in y and
    cancels in the normalisation, so it is dropped (matmuls only).

    Args:
        V: value matrix (d, d), or a function of t.
        Q: query matrix (k, d).
        K: key matrix (k, d).
        blocking: "auto" (blocked above 2048^2 query-key pairs), "dense" or
            "blocked" (O(block_size^2) memory, `_blocked`).
        block_size: keys per block of the blocked kernel (queries: 4x as many).
    """

    V: Param
    Q: Param
    K: Param
    blocking: str = eqx.field(static=True)
    block_size: int = eqx.field(static=True)

    def __init__(
        self,
        V: ParamLike,
        *,
        Q: ParamLike,
        K: ParamLike,
        blocking: str = "auto",
        block_size: int = 512,
    ):
        self.V, _, self.Q, self.K = init_params(V, None, Q, K, "L2Attention")
        self.blocking, self.block_size = check_blocking(blocking, block_size)

    def features(self, z, x, t):
        """(2 Q z, K x, -|K x|^2)."""
        qz, kx = bilinear_features(None, self.Q, self.K, t, z, x)
        return 2 * qz, kx, -jnp.sum(kx**2, axis=-1)
