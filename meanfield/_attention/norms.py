"""Norms of attention parameters and the mean-field Lipschitz constant.

Every bound in meanfield (Gronwall stability, mean-field and finite-n Lipschitz
bounds) is written with |V|_2 and the constants (c_x, c_y, c_o) of the log-kernel
phi(x, y) on the ball B_R: |grad_x phi| <= c_x R (through Cov), |grad_y phi| <= c_y R,
osc_y phi <= c_o R^2 (derivation in `wasserstein._stability`'s module docstring).
Each family gives its constants (`AbstractAttention.kernel_constants`); this module
only combines them over the heads of `AbstractAttention.flat_heads`.
"""

import jax
import jax.numpy as jnp

from .base import AbstractAttention, norm2, param_at

__all__ = ["meanfield_lipschitz", "norm2", "value_norm"]


def value_norm(head: AbstractAttention, t, d: int, out) -> jax.Array:
    """|W V|_2 at t: the head's contribution to the support growth rate.

    Args:
        head: a single-family head with a value matrix `V`.
        t: time of time-dependent parameters.
        d: token dimension.
        out: W (d, d), the output matrix composed down to the head, or None (I).

    Returns:
        The spectral norm (scalar).
    """
    V = param_at(head.V, t, "V", (d, d))
    return norm2(V if out is None else out @ V)


def meanfield_lipschitz(
    attn: AbstractAttention, R, t, d: int, hardy: float = 1.0
) -> jax.Array:
    """L(R) = sum_h |W_h V_h| (h + (c_x + 2 h c_y) R^2) e^{c_o R^2}; inf without one.

    Softmax: |V| (1 + 3 |A| R^2) e^{2 |A| R^2} (Geshkovski et al., 2023).

    Args:
        attn: any attention; +inf unless every head gives `kernel_constants`.
        R: radius of the support.
        t: time of time-dependent parameters.
        d: token dimension.
        hardy: h, the norm of the prefix average (1 unmasked; see `_stability`).

    Returns:
        L(R) (scalar).
    """
    total = 0.0
    for head, out in attn.flat_heads(t, d):
        c = head.kernel_constants(t, d)
        if c is None:
            return jnp.asarray(jnp.inf)
        cx, cy, co = c
        R2 = R**2
        total = total + value_norm(head, t, d, out) * (
            hardy + (cx + 2 * hardy * cy) * R2
        ) * jnp.exp(co * R2)
    return total
