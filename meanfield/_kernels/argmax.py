"""Hardmax averages: for each query, the weighted mean of the values of its best keys.

out_i = sum_{j in S_i} w_j v_j / sum_{j in S_i} w_j,
S_i = {j visible to i, w_j > 0 : l_ij >= max_j' l_ij' - tol_i},  l_ij = <q_i, k_j>,

the beta -> inf limit of softmax_j(beta l_ij + log w_j). Ties are logits within
tol_i of the maximum: `tolerance` gives the rounding bound of a k-term dot product,
so tokens that coincide share the attention whatever the rounding of their
logits. Dense (one (m, n) matrix) or blocked (a pass for the maxima, a pass for
the sums, O(block_q block_k) memory).
"""

import jax
import jax.numpy as jnp
from jaxtyping import Array, Float

from .blocked import pad_rows

#: Ties: logits within TIE_ULPS k eps |q_i| max_j |k_j| of the row maximum
#: (a k-term dot product rounds by at most k eps |q_i| |k_j|; twice, with margin).
TIE_ULPS = 4


def tolerance(q: Float[Array, "m k"], keys: Float[Array, "n k"]) -> Float[Array, " m"]:
    """tol_i = TIE_ULPS k eps |q_i| max_j |k_j|, the ties' window (no gradient)."""
    eps = jnp.finfo(q.dtype).eps
    k_max = jnp.max(jnp.linalg.norm(keys, axis=-1))
    tol = TIE_ULPS * q.shape[-1] * eps * jnp.linalg.norm(q, axis=-1) * k_max
    return jax.lax.stop_gradient(tol)


def _visible(key_weights, query_pos, key_pos, shape) -> Array:
    """(bq, bk) mask: positive weight, and s_j <= s_i when masked."""
    visible = jnp.broadcast_to((key_weights > 0)[None, :], shape)
    if query_pos is not None:
        visible = visible & (key_pos[None, :] <= query_pos[:, None])
    return visible


def dense_average(
    q: Float[Array, "m k"],
    keys: Float[Array, "n k"],
    key_weights: Float[Array, " n"],
    values: Float[Array, "n dv"],
    query_pos: Float[Array, " m"] | None = None,
    key_pos: Float[Array, " n"] | None = None,
) -> Float[Array, "m dv"]:
    """The hardmax average with one (m, n) logits matrix (0 where no key is seen)."""
    logits = q @ keys.T
    visible = _visible(key_weights, query_pos, key_pos, logits.shape)
    logits = jnp.where(visible, logits, -jnp.inf)
    best = jax.lax.stop_gradient(jnp.max(logits, axis=1, keepdims=True))
    chosen = visible & (logits >= best - tolerance(q, keys)[:, None])
    coef = jnp.where(chosen, key_weights[None, :], 0)
    total = jnp.sum(coef, axis=1, keepdims=True)
    return (coef @ values) / jnp.where(total > 0, total, 1)


def blocked_average(
    q: Float[Array, "m k"],
    keys: Float[Array, "n k"],
    key_weights: Float[Array, " n"],
    values: Float[Array, "n dv"],
    query_pos: Float[Array, " m"] | None = None,
    key_pos: Float[Array, " n"] | None = None,
    *,
    block_q: int = 2048,
    block_k: int = 512,
) -> Float[Array, "m dv"]:
    """`dense_average` in O(block_q block_k) memory, with the same ties.

    Each query block scans the key blocks twice: once for the row maxima, once
    for the weight and weighted sum of values of the keys within the tolerance of
    them (one pass with a running maximum would keep keys that tie an earlier,
    slightly lower maximum). Logits cost no exponential, so the second pass
    costs what the first does.
    """
    m, n = q.shape[0], keys.shape[0]
    block_q, block_k = max(1, min(block_q, m)), max(1, min(block_k, n))
    dtype = jnp.result_type(q.dtype, keys.dtype, values.dtype)
    masked = query_pos is not None
    tol = tolerance(q, keys)
    # Padded keys have weight 0 (never chosen); padded queries are cut off.
    k_blocks = pad_rows(keys, block_k, 0).reshape(-1, block_k, keys.shape[1])
    w_blocks = pad_rows(key_weights.astype(dtype), block_k, 0).reshape(-1, block_k)
    v_blocks = pad_rows(values, block_k, 0).reshape(-1, block_k, values.shape[1])
    kp = key_pos if masked else jnp.zeros((n,), dtype)
    p_blocks = pad_rows(kp, block_k, jnp.inf).reshape(-1, block_k)
    qp = query_pos if masked else jnp.zeros((m,), dtype)
    q_blocks = pad_rows(q, block_q, 0).reshape(-1, block_q, q.shape[1])
    qp_blocks = pad_rows(qp, block_q, 0).reshape(-1, block_q)
    tol_blocks = pad_rows(tol, block_q, 0).reshape(-1, block_q)
    key_xs = (k_blocks, w_blocks, v_blocks, p_blocks)

    @jax.checkpoint
    def one_query_block(args):
        qb, qpb, tolb = args

        def logits_of(kb):
            k, w, _, kpb = kb
            logits = qb @ k.T
            visible = _visible(w, qpb if masked else None, kpb, logits.shape)
            return jnp.where(visible, logits, -jnp.inf), visible

        def row_max(best, kb):
            return jnp.maximum(best, jnp.max(logits_of(kb)[0], axis=1)), None

        bq = qb.shape[0]
        best, _ = jax.lax.scan(row_max, jnp.full((bq,), -jnp.inf, dtype), key_xs)
        best = jax.lax.stop_gradient(best)

        def accumulate(carry, kb):
            total, acc = carry
            logits, visible = logits_of(kb)
            chosen = visible & (logits >= (best - tolb)[:, None])
            coef = jnp.where(chosen, kb[1][None, :], 0)
            return (
                total + jnp.sum(coef, axis=1),
                acc + coef @ kb[2].astype(dtype),
            ), None

        init = (jnp.zeros((bq,), dtype), jnp.zeros((bq, values.shape[1]), dtype))
        (total, acc), _ = jax.lax.scan(accumulate, init, key_xs)
        return acc / jnp.where(total > 0, total, 1)[:, None]

    out = jax.lax.map(one_query_block, (q_blocks, qp_blocks, tol_blocks))
    return out.reshape(-1, values.shape[1])[:m]
