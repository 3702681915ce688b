"""The softmax field of one small system of unit tokens, in few passes.

`mf.simulate_ensemble` evaluates millions of fields of a few dozen tokens
(`_ensemble_queue`). `SoftmaxAttention`'s own evaluation serves every size and
every token: it rescales huge tokens by a power of two before the logits and
undoes it in the exponent, and computes the denominator in a pass of its own.
For the schemes that evaluate the field on directions θ = x / |x| (every
normalization but None) no token is huge: the logits are bounded by |A|₂ and
need no rescaling. This module evaluates that field as the dense kernel does
(`_kernels.dense`: row maximum, masked keys at -inf, an empty row gives 0) with
the denominator from the same product as the numerator,

    Γ(θᵢ) = Σⱼ pᵢⱼ V θⱼ / Σⱼ pᵢⱼ,   pᵢⱼ = wⱼ e^{⟨Aθᵢ, θⱼ⟩ − mᵢ},

one (n, d + 1) product of the weights with [Vθ, 1]. It is the same function to
rounding (tests compare it with `SoftmaxAttention.velocity` at 1e-13 in float64).
"""

import equinox as eqx
import jax
import jax.numpy as jnp

from ._attention.base import interaction_matrix, key_positions, param_at
from ._attention.softmax import SoftmaxAttention
from ._kernels.dense import causal_mask, log_weights
from ._linalg import matmul_small


def applies(attn, normalization) -> bool:
    """Whether `SmallSoftmax` can stand in for `attn` under `normalization`."""
    return type(attn) is SoftmaxAttention and normalization is not None


class SmallSoftmax(eqx.Module):
    """`SoftmaxAttention` on unit tokens, as `_normalization.velocity` calls it.

    Attributes:
        attn: the attention it evaluates (A or Q, K; V; constants or functions
            of t).
    """

    attn: SoftmaxAttention

    def sphere_velocity(self, measure, t=0.0):
        """None: the caller projects `velocity_and_status` (as for softmax)."""
        return None

    def velocity_and_status(self, measure, t=0.0):
        """(Γ at the atoms (n, d), True) for atoms with |xᵢ| = 1."""
        x = measure.x
        d = x.shape[-1]
        # q = A x (A = K^T Q for a query/key pair), keys = x; short products
        # slice by slice (`matmul_small`).
        q = matmul_small(x, interaction_matrix(self.attn, t, d))
        logits = matmul_small(q, x) + log_weights(measure.weights)[None, :]
        positions = key_positions(measure)
        if positions is not None:
            logits = jnp.where(causal_mask(positions, positions), logits, -jnp.inf)
        # Row maxima, at least the lowest finite float: an empty row (every key
        # masked or of weight 0) shifts by a finite number and gives 0 below.
        row_max = jnp.maximum(
            jnp.max(logits, axis=-1, keepdims=True), jnp.finfo(x.dtype).min
        )
        p = jnp.exp(logits - jax.lax.stop_gradient(row_max))
        V = param_at(self.attn.V, t, "V", (d, d))
        values = jnp.concatenate([matmul_small(x, V), jnp.ones_like(x[:, :1])], -1)
        sums = p @ values
        denom = jnp.maximum(sums[:, d:], jnp.finfo(x.dtype).tiny)
        return sums[:, :d] / denom, jnp.array(True)
