"""Softmax average of bounded logits: one exponential per pair, no maximum.

For logits l_ij = <q_i, k_j> + b_j, Cauchy-Schwarz gives |<q_i, k_j>| <= |q_i| R
(R = max_j |k_j|). Softmax is shift-invariant; shifted by the scalar max_j b_j, the
terms e^{l_ij - max b} lie below e^{|q_i| R}, and the key of largest bias alone gives
a row sum >= e^{-|q_i| R}. While |q_i| R is small enough (`logit_limit`), the kernel
then needs no max pass and no rescaling (the online softmax of `blocked` has both):
one exponential per pair, fused with the logits, and one matmul of the (block_q, n)
weights against [1, v_j], which gives the row sums and the weighted values at once.

Exact to rounding: no term overflows, and the terms flushed to 0 (below the
smallest normal) lose less than eps / 16 of a row sum. The exponent is
<q_i, k_j> + (b_j - max b), rounded to eps |l_ij - max b| <= eps (|<q_i, k_j>| +
|b_j - max b|), where the max-shifted form has eps (|l_ij| + |l_ij - m_i|), m_i the row
maximum. Where some |q_i| R exceeds the limit (large logits: large A or tokens),
`softmax_average` runs the caller's fallback instead (`lax.cond`; under `vmap`
both branches run).

See [The blocked online softmax][math-online-softmax] for the kernel it replaces.
"""

import math
from collections.abc import Callable

import jax
import jax.numpy as jnp
from jaxtyping import Array, Float

#: Up to this many features the logits are a sum of broadcast products fused with
#: the exponential; at d = 2, n = 16384 a matmul for them ran 1.14x slower (CPU).
MAX_FEATURES = 4
#: Tiles of `BLOCK_Q` queries x `KEY_CHUNK` keys (4 MiB in float32): the weights
#: are written once and read once by the matmul. At d = 2 (CPU) chunks of 2^11,
#: 2^12, 2^13 and 2^16 keys were within 6 % of each other at n = 16384, and 2^12,
#: 2^13 were 10 % faster than 2^16 at n = 65536. Sums of 4096 keys per matmul round
#: like the dense kernel: float32 error 8e-7 of the largest velocity at n = 16384
#: (dense: 7e-7), 2e-7 at n = 65536.
KEY_CHUNK = 4096
BLOCK_Q = 256


def logit_limit(dtype, n: int) -> float:
    """Largest |q_i| R for which the kernel is exact to rounding.

    Shifted by max b, every term is <= e^{|q_i| R} and a row sums to >= e^{-|q_i| R}.
    The terms flushed to 0 (below the smallest normal, `tiny`) sum to < n tiny: their
    share of the row is < n tiny e^{|q_i| R}, below eps / 16 for |q_i| R <=
    log(1 / tiny) - log n - log(1 / eps) - log 16. Then n e^{|q_i| R} < 1 / (16 eps
    tiny) stays below the largest float: no sum overflows.

    Args:
        dtype: the dtype of the logits.
        n: number of keys.

    Returns:
        The limit (float32, n = 2^16: 57.5; float64: about 660).
    """
    info = jnp.finfo(dtype)
    return (
        -math.log(float(info.tiny))
        - math.log(max(n, 1))
        - math.log(1 / float(info.eps))
        - math.log(16)
    )


def _pad_rows(a: Array, multiple: int, fill) -> Array:
    pad = (-a.shape[0]) % multiple
    if pad == 0:
        return a
    return jnp.pad(a, [(0, pad)] + [(0, 0)] * (a.ndim - 1), constant_values=fill)


def _logits(q, keys_t, bias):
    """<q_i, k_j> + b_j for a query block (bq, k) against keys (k, n), shape (bq, n).

    For k <= MAX_FEATURES a sum of broadcast products that XLA fuses with the
    exponential (no separate logits buffer).
    """
    k = q.shape[1]
    if k > MAX_FEATURES:
        return q @ keys_t + bias[None, :]
    s = bias[None, :]
    for c in reversed(range(k)):
        s = q[:, c : c + 1] * keys_t[c][None, :] + s
    return s


def _exp_sums(q, keys, bias, values):
    """sum_j e^{l_ij} [1, v_j] for every query, shape (m, 1 + dv).

    Queries go in blocks of at most `BLOCK_Q` (`lax.map`; one lane per device, as
    in `blocked`), keys in chunks of at most `KEY_CHUNK` (`lax.scan`); each block
    is `jax.checkpoint`ed, so reverse mode keeps O(n d) residuals.
    """
    m, n = q.shape[0], keys.shape[0]
    dtype = q.dtype
    ext = jnp.concatenate([jnp.ones((n, 1), dtype), values.astype(dtype)], axis=1)
    chunk = min(n, KEY_CHUNK)
    # Padded keys: bias -inf, so they add e^{-inf} = 0.
    keys_c = _pad_rows(keys, chunk, 0).reshape(-1, chunk, keys.shape[1])
    keys_c = jnp.swapaxes(keys_c, 1, 2)  # (chunks, k, chunk): rows broadcast
    bias_c = _pad_rows(bias, chunk, -jnp.inf).reshape(-1, chunk)
    ext_c = _pad_rows(ext, chunk, 0).reshape(-1, chunk, ext.shape[1])
    groups = jax.device_count()
    block_q = max(1, min(BLOCK_Q, -(-m // groups)))
    # Padded queries (q = 0) are cut off below.
    q_b = _pad_rows(q, block_q * groups, 0).reshape(groups, -1, block_q, q.shape[1])

    def over_chunks(acc, chunk_xs):
        keys_t, b, e = chunk_xs

        @jax.checkpoint
        def one_block(qb):
            return jnp.exp(_logits(qb, keys_t, b)) @ e

        sums = jax.vmap(lambda qs: jax.lax.map(one_block, qs))(q_b)
        return acc + sums, None

    acc0 = jnp.zeros((*q_b.shape[:3], ext.shape[1]), dtype)
    acc, _ = jax.lax.scan(over_chunks, acc0, (keys_c, bias_c, ext_c))
    return acc.reshape(-1, ext.shape[1])[:m]


def softmax_average(
    q: Float[Array, "m k"],
    keys: Float[Array, "n k"],
    key_bias: Float[Array, " n"],
    values: Float[Array, "n dv"],
    *,
    fallback: Callable[[], Float[Array, "m dv"]],
    logit_scale: Float[Array, ""] | None = None,
) -> Float[Array, "m dv"]:
    """sum_j softmax_j(c^2 (<q_i, k_j> + b_j)) v_j with no running maximum.

    Same conventions as `blocked.softmax_average` without positions (-inf bias
    removes a key; c = `logit_scale` or 1), for keys with at least one finite bias.

    Args:
        q: queries, shape (m, k).
        keys: shape (n, k).
        key_bias: shape (n,).
        values: shape (n, dv).
        fallback: evaluates the same average another way (e.g. the online
            softmax), run instead where some c^2 |q_i| R exceeds `logit_limit` or
            is not finite.
        logit_scale: c, a power of two (None: 1).

    Returns:
        Shape (m, dv).
    """
    dtype = jnp.result_type(q.dtype, keys.dtype, key_bias.dtype)
    q, keys, bias = q.astype(dtype), keys.astype(dtype), key_bias.astype(dtype)
    if logit_scale is not None:
        # c is a power of two: the products are exact, and the logits (bounded
        # where this path runs) are the true ones, with no c^2 per pair.
        c = logit_scale.astype(dtype)
        q, keys, bias = q * c, keys * c, (bias * c) * c
    # max_i |q_i| R; NaN compares False: non-finite features take the fallback.
    bound = jnp.sqrt(jnp.max(jnp.sum(q * q, axis=1))) * jnp.sqrt(
        jnp.max(jnp.sum(keys * keys, axis=1))
    )
    ok = jnp.all(bound <= logit_limit(dtype, keys.shape[0]))
    # Under vmap both branches run: the unused one gets finite inputs.
    q, keys = jnp.where(ok, q, 0), jnp.where(ok, keys, 0)
    # Exactly 0 for uniform weights; the result does not depend on the shift.
    bias = bias - jax.lax.stop_gradient(jnp.max(bias))

    def bounded():
        sums = _exp_sums(q, keys, bias, values)
        # Row sums are >= e^{-|q_i| R} > 0 for every query.
        return sums[:, 1:] / sums[:, :1]

    return jax.lax.cond(ok, bounded, fallback)
