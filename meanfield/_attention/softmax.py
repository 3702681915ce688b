"""Softmax self-attention (as a PDE: Geshkovski et al., 2023; Castin et al., 2025)."""

from .._custom_types import Param, ParamLike
from .base import AbstractKernelAttention, bilinear_features, init_params


class SoftmaxAttention(AbstractKernelAttention):
    """Softmax attention, k(x, y) = e^{<A x, y>} normalised against mu.

    Gamma_mu(x) = int e^{<A x, y>} V y dmu(y) / int e^{<A x, y>} dmu(y).

    Args:
        V: value matrix (d, d), or a function of t.
        A: interaction matrix A = K^T Q (d, d); give either A or both Q and K.
        Q: query matrix (k, d).
        K: key matrix (k, d).

    Raises:
        ValueError: both or neither of A and (Q, K); shapes that do not match.
    """

    V: Param
    A: Param | None
    Q: Param | None
    K: Param | None

    def __init__(
        self,
        V: ParamLike,
        *,
        A: ParamLike | None = None,
        Q: ParamLike | None = None,
        K: ParamLike | None = None,
    ):
        self.V, self.A, self.Q, self.K = init_params(V, A, Q, K, "SoftmaxAttention")

    def features(self, z, x, t):
        """(A z, x, None): log k(z, x) = <A z, x>."""
        q, keys = bilinear_features(self.A, self.Q, self.K, t, z, x)
        return q, keys, None
