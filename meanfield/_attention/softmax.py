"""Softmax self-attention (as a PDE: Geshkovski et al., 2023; Castin et al., 2025)."""

import equinox as eqx
import jax.numpy as jnp

from .._custom_types import Param, ParamLike
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


@register("softmax")
class SoftmaxAttention(AbstractKernelAttention):
    """Softmax attention, k(x, y) = e^{<A x, y>} normalised against mu.

    Gamma_mu(x) = int e^{<A x, y>} V y dmu(y) / int e^{<A x, y>} dmu(y).

    See [Normalised kernels][math-normalised-kernels] for the kernel and its blocked
    evaluation, and [Gaussians][math-gaussian-softmax] for its field on a Gaussian.

    Args:
        V: value matrix (d, d), or a function of t.
        A: interaction matrix A = K^T Q (d, d); give either A or both Q and K.
        Q: query matrix (k, d).
        K: key matrix (k, d).
        blocking: "auto" (dense up to 2048^2 query-key pairs; above, the kernel
            of bounded logits `_kernels.bounded` for unmasked features of
            dimension <= 4 whose logits it can take, else blocked), "dense",
            "blocked" (O(block_size^2) memory, `_blocked`) or "fused" (one Pallas
            kernel, `_kernels.fused`: Triton on a GPU, interpreted elsewhere;
            derivatives through the blocked kernel).
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

    def kernel_constants(self, t, d):
        """Constants of phi = <A x, y>: c_x = c_y = |A|_2 and c_o = 2 |A|_2."""
        a = norm2(interaction_matrix(self, t, d))
        return a, a, 2 * a

    def lipschitz_growth(self, n, R, t, d):
        """sqrt(3) (|A|_2^2 R^4 (4 n + 1) + n)^{1/2}.

        Castin, Ablin & Peyre (ICML 2024), Thm 3.3, and Thm 4.3 for masked
        attention: Lip <= |V|_2 times this on B_R^n.
        """
        a = norm2(interaction_matrix(self, t, d))
        return jnp.sqrt(3.0) * jnp.sqrt(a**2 * R**4 * (4 * n + 1) + n)

    def gaussian_field(self, mean, cov, t):
        """B = V Sigma A, b = V alpha.

        Tilting N(alpha, Sigma) by e^{<A x, y>} gives N(alpha + Sigma A x, Sigma).
        """
        d = mean.shape[0]
        V = param_at(self.V, t, "V", (d, d))
        return V @ cov @ interaction_matrix(self, t, d), V @ mean
