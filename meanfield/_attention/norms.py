"""Norms and kernel constants of attention parameters, shared by bounds.

Every bound in meanfield (Gronwall stability, mean-field and finite-n Lipschitz
bounds) is written with |V|_2 and the constants (c_x, c_y, c_o) of the log-kernel
phi(x, y) on the ball B_R: |grad_x phi| <= c_x R (through Cov), |grad_y phi| <= c_y R,
osc_y phi <= c_o R^2. Derivation in `_stability`'s module docstring.
"""

import jax
import jax.numpy as jnp

from .base import interaction_matrix, param_at
from .l2 import L2Attention
from .multihead import MultiHeadAttention, heads_with_outputs
from .softmax import SoftmaxAttention


def norm2(M) -> jax.Array:
    """Spectral norm |M|_2."""
    return jnp.linalg.norm(M, ord=2)


def flat_heads(attn, t, d, out=None) -> list:
    """[(head, output matrix composed down to it, or None)], nested heads expanded."""
    if not isinstance(attn, MultiHeadAttention):
        return [(attn, out)]
    flat = []
    for head, W in heads_with_outputs(attn, t, d):
        W = out if W is None else (W if out is None else out @ W)
        flat += flat_heads(head, t, d, W)
    return flat


def value_norm(head, t, d, out) -> jax.Array:
    """|W V|_2 at t: the head's contribution to the support growth rate."""
    V = param_at(head.V, t, "V", (d, d))
    return norm2(V if out is None else out @ V)


def kernel_constants(head, t, d) -> tuple | None:
    """(c_x, c_y, c_o) of the module docstring at t; None without a bound."""
    if isinstance(head, SoftmaxAttention):
        a = interaction_norm(head, t, d)
        return a, a, 2 * a
    if isinstance(head, L2Attention):
        Q = param_at(head.Q, t, "Q", (None, d))
        K = param_at(head.K, t, "K", (Q.shape[0], d))
        a, k2 = 2 * norm2(K.T @ Q), norm2(K) ** 2
        return a, a + 2 * k2, 2 * a + k2
    return None


def interaction_norm(head, t, d) -> jax.Array:
    """|A|_2 of a softmax head, A = K^T Q when given as (Q, K)."""
    return norm2(interaction_matrix(head, t, d))


def meanfield_lipschitz(attn, R, t, d, hardy: float = 1.0) -> jax.Array:
    """L(R) = sum_h |W_h V_h| (h + (c_x + 2 h c_y) R^2) e^{c_o R^2}; inf without one.

    Softmax: |V| (1 + 3 |A| R^2) e^{2 |A| R^2} (Geshkovski et al., 2023).
    """
    total = 0.0
    for head, out in flat_heads(attn, t, d):
        c = kernel_constants(head, t, d)
        if c is None:
            return jnp.asarray(jnp.inf)
        cx, cy, co = c
        R2 = R**2
        total = total + value_norm(head, t, d, out) * (
            hardy + (cx + 2 * hardy * cy) * R2
        ) * jnp.exp(co * R2)
    return total
