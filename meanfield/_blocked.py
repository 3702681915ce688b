"""Blocked (online) log-sum-exp over all query-key pairs in O(block^2) memory.

out_i = log sum_j exp(score(q_i, k_j) + b_j) is computed without the (n, m) matrix:
queries are mapped in blocks of `block_q` (`lax.map`), and for each query block the
keys are scanned in blocks of `block_k` with a running maximum and a running sum
(the online log-sum-exp of flash attention), so peak memory is O(block_q * block_k)
plus the inputs.
"""

from collections.abc import Callable

import jax
import jax.numpy as jnp
from jaxtyping import Array, Float

# (queries (bq, ...), keys (bk, ...)) -> scores (bq, bk)
ScoreFn = Callable[[Array, Array], Array]


def _pad_rows(a: Array, multiple: int, fill) -> Array:
    pad = (-a.shape[0]) % multiple
    if pad == 0:
        return a
    widths = [(0, pad)] + [(0, 0)] * (a.ndim - 1)
    return jnp.pad(a, widths, constant_values=fill)


def logsumexp(
    score: ScoreFn,
    queries: Float[Array, "n ..."],
    keys: Float[Array, "m ..."],
    key_bias: Float[Array, " m"],
    *,
    block_q: int = 1024,
    block_k: int = 1024,
) -> Float[Array, " n"]:
    """out_i = log sum_j exp(score(q_i, k_j) + key_bias_j), blocked.

    Args:
        score: maps a query block (bq, ...) and a key block (bk, ...) to (bq, bk).
        queries: shape (n, ...).
        keys: shape (m, ...).
        key_bias: shape (m,); -inf removes a key (zero weight).
        block_q: queries per block (clipped to n).
        block_k: keys per block (clipped to m).

    Returns:
        Shape (n,), -inf for a query that sees no key with finite bias.
    """
    n, m = queries.shape[0], keys.shape[0]
    block_q, block_k = max(1, min(block_q, n)), max(1, min(block_k, m))
    dtype = jnp.result_type(queries.dtype, keys.dtype, key_bias.dtype)
    # Padded keys get bias -inf and contribute exp(-inf) = 0.
    k_blocks = _pad_rows(keys, block_k, 0).reshape(-1, block_k, *keys.shape[1:])
    b_blocks = _pad_rows(key_bias.astype(dtype), block_k, -jnp.inf).reshape(-1, block_k)
    q_blocks = _pad_rows(queries, block_q, 0).reshape(-1, block_q, *queries.shape[1:])
    # A finite initial maximum: exp(m_old - m_new) never sees inf - inf.
    lowest = jnp.finfo(dtype).min

    def one_query_block(q):
        def step(carry, kb):
            run_max, run_sum = carry
            k, b = kb
            s = score(q, k).astype(dtype) + b[None, :]
            new_max = jnp.maximum(run_max, jnp.max(s, axis=1))
            run_sum = run_sum * jnp.exp(run_max - new_max) + jnp.sum(
                jnp.exp(s - new_max[:, None]), axis=1
            )
            return (new_max, run_sum), None

        init = (
            jnp.full((q.shape[0],), lowest, dtype),
            jnp.zeros((q.shape[0],), dtype),
        )
        (run_max, run_sum), _ = jax.lax.scan(step, init, (k_blocks, b_blocks))
        return jnp.log(run_sum) + run_max

    return jax.lax.map(one_query_block, q_blocks).reshape(-1)[:n]
