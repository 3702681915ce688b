"""Blocked (online) softmax over all query-key pairs in O(block^2) memory.

log sum_j exp(score(q_i, k_j) + b_j) and sum_j softmax_j(...) v_j are computed
without the (n, m) matrix: queries are mapped in blocks of `block_q` (`lax.map`),
and for each query block the keys are scanned in blocks of `block_k` with a running
maximum, a running sum and a running weighted sum of values (the online softmax of
flash attention), so peak memory is O(block_q * block_k) plus the inputs.
"""

from collections.abc import Callable

import jax
import jax.numpy as jnp
from jaxtyping import Array, Float

from .dense import unscale

# (queries (bq, ...), keys (bk, ...)) -> scores (bq, bk)
ScoreFn = Callable[[Array, Array], Array]


def pad_rows(a: Array, multiple: int, fill) -> Array:
    """`a` padded with `fill` along axis 0 to a multiple of `multiple` rows."""
    pad = (-a.shape[0]) % multiple
    if pad == 0:
        return a
    widths = [(0, pad)] + [(0, 0)] * (a.ndim - 1)
    return jnp.pad(a, widths, constant_values=fill)


def _online(
    score: ScoreFn,
    queries,
    keys,
    key_bias,
    values,
    query_pos,
    key_pos,
    block_q: int,
    block_k: int,
    logit_scale=None,
):
    """(running max, running sum, running sum of values) per query, blocked.

    Queries go in blocks through `lax.map`; each query block scans the key blocks,
    rescaling its accumulators by exp(old max - new max) (online softmax). With
    positions, a key block is skipped (`lax.cond`) when no key in it is visible to
    any query of the block (min s_key > max s_query); sorted positions make most
    blocks either fully visible or skipped. Both levels are `jax.checkpoint`ed, so
    reverse mode keeps O(n d) residuals instead of the (n, m) matrix. With a
    `logit_scale` c the scores are the true ones / c^2: maxima are kept on that
    scale and shifted scores are multiplied back (`dense.unscale`).
    """
    n, m = queries.shape[0], keys.shape[0]
    block_q, block_k = max(1, min(block_q, n)), max(1, min(block_k, m))
    dtype = jnp.result_type(queries.dtype, keys.dtype, key_bias.dtype)
    masked = query_pos is not None
    with_values = values is not None
    # Padded keys get bias -inf (and an invisible position): they add exp(-inf) = 0.
    k_blocks = pad_rows(keys, block_k, 0).reshape(-1, block_k, *keys.shape[1:])
    b_blocks = pad_rows(key_bias.astype(dtype), block_k, -jnp.inf).reshape(-1, block_k)
    # Query blocks in `groups` independent lanes (vmap) of sequential blocks
    # (lax.map): with the particle axis sharded over G devices, each device runs
    # its own lane; on one device there is a single lane.
    groups = jax.device_count()
    block_q = min(block_q, -(-n // groups))
    q_blocks = pad_rows(queries, block_q * groups, 0).reshape(
        groups, -1, block_q, *queries.shape[1:]
    )
    key_xs = [k_blocks, b_blocks]
    if with_values:
        key_xs.append(
            pad_rows(values, block_k, 0).reshape(-1, block_k, values.shape[1])
        )
    if masked:
        key_xs.append(pad_rows(key_pos, block_k, jnp.inf).reshape(-1, block_k))
        qp_blocks = pad_rows(query_pos, block_q * groups, -jnp.inf).reshape(
            groups, -1, block_q
        )
    else:
        qp_blocks = jnp.zeros((*q_blocks.shape[:2], 0), dtype)
    # A finite initial maximum: exp(m_old - m_new) never sees inf - inf.
    lowest = jnp.finfo(dtype).min

    @jax.checkpoint
    def one_query_block(args):
        q, qp = args

        @jax.checkpoint
        def update(carry, kb):
            run_max, run_sum, acc = carry
            k, b = kb[0], kb[1]
            s = score(q, k).astype(dtype) + b[None, :]
            if masked:
                s = jnp.where(kb[-1][None, :] <= qp[:, None], s, -jnp.inf)
            new_max = jnp.maximum(run_max, jnp.max(s, axis=1))
            scale = jnp.exp(unscale(run_max - new_max, logit_scale))
            p = jnp.exp(unscale(s - new_max[:, None], logit_scale))
            run_sum = run_sum * scale + jnp.sum(p, axis=1)
            if with_values:
                acc = acc * scale[:, None] + p @ kb[2].astype(dtype)
            return (new_max, run_sum, acc)

        def step(carry, kb):
            if masked:  # skip key blocks no query of this block can see
                visible = jnp.min(kb[-1]) <= jnp.max(qp)
                carry = jax.lax.cond(visible, update, lambda c, _: c, carry, kb)
            else:
                carry = update(carry, kb)
            return carry, None

        bq = q.shape[0]
        acc0 = jnp.zeros((bq, values.shape[1] if with_values else 0), dtype)
        init = (jnp.full((bq,), lowest, dtype), jnp.zeros((bq,), dtype), acc0)
        carry, _ = jax.lax.scan(step, init, tuple(key_xs))
        return carry

    run_max, run_sum, acc = jax.vmap(lambda qs: jax.lax.map(one_query_block, qs))(
        (q_blocks, qp_blocks)
    )
    run_max, run_sum = run_max.reshape(-1)[:n], run_sum.reshape(-1)[:n]
    if not with_values:
        return run_max, run_sum, None
    return run_max, run_sum, acc.reshape(-1, acc.shape[-1])[:n]


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
    run_max, run_sum, _ = _online(
        score, queries, keys, key_bias, None, None, None, block_q, block_k
    )
    return jnp.log(run_sum) + run_max


def _dot(q, k):
    return q @ k.T


def bilinear_logsumexp(
    q: Float[Array, "m k"],
    keys: Float[Array, "n k"],
    key_bias: Float[Array, " n"],
    *,
    block_q: int = 512,
    block_k: int = 512,
) -> Float[Array, " m"]:
    """Row log-sum-exp of attention logits <q_i, k_j> + b_j, blocked."""
    return logsumexp(_dot, q, keys, key_bias, block_q=block_q, block_k=block_k)


def softmax_average(
    q: Float[Array, "m k"],
    keys: Float[Array, "n k"],
    key_bias: Float[Array, " n"],
    values: Float[Array, "n dv"],
    query_pos: Float[Array, " m"] | None = None,
    key_pos: Float[Array, " n"] | None = None,
    *,
    block_q: int = 512,
    block_k: int = 512,
    logit_scale: Float[Array, ""] | None = None,
) -> Float[Array, "m dv"]:
    """sum_j softmax_j(c^2 (<q_i, k_j> + b_j)) v_j over keys with s_j <= s_i, blocked.

    The blocked twin of `_kernels.softmax_average` (same conventions: -inf bias
    removes a key, a query that sees no key gets 0, c = `logit_scale` or 1), in
    O(block_q block_k) memory.
    """
    _, run_sum, acc = _online(
        _dot,
        q,
        keys,
        key_bias,
        values,
        query_pos,
        key_pos,
        block_q,
        block_k,
        logit_scale,
    )
    return acc / jnp.where(run_sum > 0, run_sum, 1)[:, None]
