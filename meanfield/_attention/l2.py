"""L2 self-attention (Kim, Papamakarios & Mnih, ICML 2021)."""

import equinox as eqx
import jax.numpy as jnp

from .._custom_types import Param, ParamLike
from .._linalg import graded_tilt, inverse
from .base import (
    AbstractKernelAttention,
    bilinear_features,
    check_blocking,
    init_params,
    interaction_matrix,
    norm2,
    param_at,
)
from .registry import register


@register("l2")
class L2Attention(AbstractKernelAttention):
    """L2 attention: k(x, y) = exp(-|Q x - K y|^2), row-normalised.

    -|Qx - Ky|^2 = 2<Qx, Ky> - |Ky|^2 - |Qx|^2; the last term is constant in y and
    cancels in the normalisation, so it is dropped (matmuls only).

    See [The families][math-kernel-families] (the L2 kernel of Kim, Papamakarios & Mnih,
    2021) and [Gaussians][math-gaussian-l2] for its field on a Gaussian.

    Args:
        V: value matrix (d, d), or a function of t.
        Q: query matrix (k, d).
        K: key matrix (k, d).
        blocking: "auto" (blocked above 2048^2 query-key pairs), "dense",
            "blocked" (O(block_size^2) memory, `_blocked`) or "fused" (one Pallas
            kernel, `_kernels.fused`: Triton on a GPU, interpreted elsewhere;
            derivatives through the blocked kernel).
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

    def _QK(self, t, d):
        Q = param_at(self.Q, t, "Q", (None, d))
        return Q, param_at(self.K, t, "K", (Q.shape[0], d))

    def kernel_constants(self, t, d):
        """Constants of phi = 2 <Q x, K y> - |K y|^2 (the x-only term cancels).

        With a = 2 |K^T Q|_2 and k = |K|_2: c_x = a, c_y = a + 2 k^2, c_o = 2 a + k^2.
        """
        Q, K = self._QK(t, d)
        a, k2 = 2 * norm2(K.T @ Q), norm2(K) ** 2
        return a, a + 2 * k2, 2 * a + k2

    def gaussian_field(self, mean, cov, t):
        """B = 2 V D Sigma A, b = V D alpha with D = (I + 2 Sigma K^T K)^{-1}.

        The tilted Gaussian has precision Sigma^{-1} + 2 K^T K
        (docs/math/gaussians.md).
        """
        d = mean.shape[0]
        V = param_at(self.V, t, "V", (d, d))
        A = interaction_matrix(self, t, d)
        _, K = self._QK(t, d)
        eye = jnp.eye(d, dtype=mean.dtype)
        D = inverse(eye + 2 * cov @ K.T @ K)
        return 2 * V @ D @ cov @ A, V @ D @ mean

    def gaussian_field_graded(self, mean, frame, scales, unit, t):
        """As `gaussian_field`, with D Sigma = (Sigma^{-1} + 2 K^T K)^{-1} from factors.

        D Sigma is bounded while Sigma may hold a huge direction; computed from
        the factors it keeps the small directions that forming Sigma rounds away.
        D = I - 2 (D Sigma) K^T K (Woodbury).
        """
        d = mean.shape[0]
        V = param_at(self.V, t, "V", (d, d))
        A = interaction_matrix(self, t, d)
        _, K = self._QK(t, d)
        KtK = K.T @ K
        tilted = graded_tilt(frame, scales, unit, 2 * KtK)
        D = jnp.eye(d, dtype=mean.dtype) - 2 * tilted @ KtK
        return 2 * V @ tilted @ A, V @ D @ mean

    def covariance_growth_rate(self, t, d):
        """|V|_2 |Q|_2 / s_min(K) when K has full column rank (|B| <= this), else |V|.

        The ratio is floored at 1 so the rate is never below the reference |V|_2.
        """
        Q, K = self._QK(t, d)
        rate = norm2(param_at(self.V, t, "V", (d, d)))
        sv = jnp.linalg.svd(K, compute_uv=False)
        s_min = sv[-1] if K.shape[0] >= d else jnp.zeros((), sv.dtype)
        full_rank = s_min > 1e-8 * sv[0]
        ratio = norm2(Q) / jnp.where(full_rank, s_min, 1)
        return rate * jnp.where(full_rank, jnp.maximum(ratio, 1), 1)
