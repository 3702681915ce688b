"""The softmax field of one small system of unit tokens, in few passes.

`mf.simulate_ensemble` evaluates millions of fields of a few dozen tokens
(`_ensemble_queue`). `SoftmaxAttention`'s own evaluation serves every size and
every token: it rescales huge tokens by a power of two before the logits and
undoes it in the exponent, and computes the denominator in a pass of its own.
For the schemes that evaluate the field on directions θ = x / |x| (every
normalization but None) no token is huge: the logits are bounded by |A|₂ and
need no rescaling, and no row maximum either. The field is

    Γ(θᵢ) = Σⱼ pᵢⱼ wⱼ V θⱼ / Σⱼ pᵢⱼ wⱼ,   pᵢⱼ = e^{⟨Aθᵢ, θⱼ⟩ − mᵢ},

with the denominator from the same product as the numerator (one (n, n) by
(n, d + 1) product of p with [wV θ, w]). Any shift mᵢ gives the same field; the
dense kernel's is the row maximum, a pass over the n × n logits that costs as
much as the exponentials. Here mᵢ is found in O(n d) from two bounds on the
row's largest logit: below, the diagonal logit ℓᵢᵢ = ⟨Aθᵢ, θᵢ⟩ (the query
always sees its own key); above, |Aθᵢ| (Cauchy–Schwarz, |θⱼ| = 1). With
mᵢ = max(ℓᵢᵢ, |Aθᵢ| − LIMIT) every weighted term is at most e^{LIMIT} (Σ w = 1),
and the diagonal one at least wᵢ e^{−2 LIMIT} (LIMIT = 0.4 log of the dtype's
largest float: 35 in float32, 283 in float64). For A = βI the diagonal is the
row maximum itself. A row whose largest term could fall below e^{−2 LIMIT}
(a diagonal logit more than 3 LIMIT below |Aθᵢ|, which needs |A|₂ > 1.5 LIMIT,
52 in float32; or a token of tiny weight) is reported as not converged, and
the work queue then solves that system with `simulate` itself. Tests compare
the field with `SoftmaxAttention.velocity` at 1e-13 in float64.
"""

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np

from ._attention.base import interaction_matrix, key_positions, param_at
from ._attention.softmax import SoftmaxAttention
from ._kernels.dense import causal_mask, log_weights
from ._linalg import last_axis_sum, matmul_small


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
        """(Γ at the atoms (n, d), safe) for atoms with |xᵢ| = 1.

        safe is False where a row's shift could leave its denominator below
        e^{-LIMIT} (see the module docstring): the caller solves again.
        """
        x = measure.x
        d = x.shape[-1]
        # q = A x (A = K^T Q for a query/key pair), keys = x; short products
        # slice by slice (`matmul_small`).
        q = matmul_small(x, interaction_matrix(self.attn, t, d))
        w = measure.weights
        logits = matmul_small(q, x)
        positions = key_positions(measure)
        if positions is not None:
            logits = jnp.where(causal_mask(positions, positions), logits, -jnp.inf)
        limit = 0.4 * float(np.log(jnp.finfo(x.dtype).max))
        q_norm = jnp.sqrt(last_axis_sum(q * q))
        diagonal = last_axis_sum(q * x)
        shift = jax.lax.stop_gradient(jnp.maximum(diagonal, q_norm - limit))
        # Every term w_j e^{l_ij - m_i} is at most e^{limit} (Σ w = 1); the
        # row's largest is at least e^{-2 limit}: the diagonal's, or any key's
        # when |q_i| is small against the smallest positive weight.
        log_w = log_weights(w)
        low_w = jnp.min(jnp.where(w > 0, log_w, 0))
        safe = (log_w + diagonal - shift >= -2 * limit) | (
            low_w - 2 * q_norm >= -2 * limit
        )
        p = jnp.exp(logits - shift[:, None])
        # The weights multiply the values: [w V x, w], one (n, d + 1) product.
        V = param_at(self.attn.V, t, "V", (d, d))
        values = jnp.concatenate([matmul_small(x, V), jnp.ones_like(x[:, :1])], -1)
        sums = p @ (values * w[:, None])
        denom = jnp.maximum(sums[:, d:], jnp.finfo(x.dtype).tiny)
        return sums[:, :d] / denom, jnp.all(safe)
