"""L2 self-attention (Kim, Papamakarios & Mnih, ICML 2021)."""

import jax.numpy as jnp

from .._custom_types import Param, ParamLike
from .base import AbstractKernelAttention, bilinear_features, init_params


class L2Attention(AbstractKernelAttention):
    """L2 attention: k(x, y) = exp(-|Q x - K y|^2), row-normalised.

    -|Qx - Ky|^2 = 2<Qx, Ky> - |Ky|^2 - |Qx|^2; the last term is constant in y and
    cancels in the normalisation, so it is dropped (matmuls only).

    Args:
        V: value matrix (d, d), or a function of t.
        Q: query matrix (k, d).
        K: key matrix (k, d).
    """

    V: Param
    Q: Param
    K: Param

    def __init__(self, V: ParamLike, *, Q: ParamLike, K: ParamLike):
        self.V, _, self.Q, self.K = init_params(V, None, Q, K, "L2Attention")

    def features(self, z, x, t):
        """(2 Q z, K x, -|K x|^2)."""
        qz, kx = bilinear_features(None, self.Q, self.K, t, z, x)
        return 2 * qz, kx, -jnp.sum(kx**2, axis=-1)
