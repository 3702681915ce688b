"""Fused online softmax average: one Pallas kernel, key tiles streamed on chip.

out_i = sum_j softmax_j(<q_i, k_j> + b_j) v_j (over keys with s_j <= s_i when
positions are given), the same quantity as `blocked.softmax_average`. The blocked
XLA kernel runs its tiles as a sequential loop of XLA operations: on a GPU each
tile step is at least one kernel launch. Here one program per block of queries
keeps its queries, running maximum, running sum and accumulator on chip and
streams every key tile through them (the forward pass of flash attention), so
the whole evaluation is one launch and the n x n logits never reach memory.

Accumulation is float32 (float64 for float64 inputs); `compute_dtype="bfloat16"`
rounds the two matrix products' inputs to bf16, as the half-precision peers do.
On a GPU the kernel compiles through Triton; elsewhere it runs in Pallas'
interpret mode (the same program as XLA operations: correct, slow), which is how
the tests check it on a CPU. Derivatives (JVP, and VJP through its transpose) are
those of the blocked XLA kernel: the fused kernel is forward-only. Imported on
first use (`_attention.base`), so `import meanfield` does not load Pallas.
"""

import functools

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jaxtyping import Array, Float

from . import blocked

#: Triton's matrix products need every tile side >= 16 (and powers of two).
_MIN_SIDE = 16


def _side(size: int) -> int:
    """The padded feature width: a power of two, at least 16."""
    return max(_MIN_SIDE, 1 << max(0, size - 1).bit_length())


def _pad_features(a: Array, side: int) -> Array:
    """Zero columns up to `side`: they add nothing to logits or values."""
    return jnp.pad(a, [(0, 0), (0, side - a.shape[1])])


def _kernel(*refs, block_k: int, key_blocks: int, masked: bool, compute_dtype):
    """One block of queries against every key tile (online softmax)."""
    q_ref, k_ref, b_ref, v_ref, c_ref, *refs = refs
    qp_ref, kp_ref, o_ref = refs if masked else (None, None, *refs)
    acc_dtype = o_ref.dtype
    q = q_ref[...]
    if compute_dtype is not None:
        q = q.astype(compute_dtype)
    rows = q.shape[0]
    qp = qp_ref[...] if masked else None
    # The logit scale c (the same for every query, given per query so that it
    # loads like any vector): max-shifted logits are multiplied by c^2 as (s c) c.
    c = c_ref[...]

    def tile(j, carry):
        run_max, run_sum, acc = carry
        keys = pl.ds(pl.multiple_of(j * block_k, block_k), block_k)
        k, v, b = k_ref[keys, :], v_ref[keys, :], b_ref[keys]
        if compute_dtype is not None:
            k, v = k.astype(compute_dtype), v.astype(compute_dtype)
        s = jnp.dot(q, k.T, preferred_element_type=acc_dtype) + b[None, :]
        if masked:
            s = jnp.where(kp_ref[keys][None, :] <= qp[:, None], s, -jnp.inf)
        new_max = jnp.maximum(run_max, jnp.max(s, axis=1))
        scale = jnp.exp(((run_max - new_max) * c) * c)
        p = jnp.exp(((s - new_max[:, None]) * c[:, None]) * c[:, None])
        run_sum = run_sum * scale + jnp.sum(p, axis=1)
        acc = acc * scale[:, None] + jnp.dot(
            p.astype(v.dtype), v, preferred_element_type=acc_dtype
        )
        return new_max, run_sum, acc

    # A finite initial maximum: exp(old - new) never meets inf - inf.
    init = (
        jnp.full((rows,), jnp.finfo(acc_dtype).min, acc_dtype),
        jnp.zeros((rows,), acc_dtype),
        jnp.zeros((rows, o_ref.shape[1]), acc_dtype),
    )
    _, run_sum, acc = jax.lax.fori_loop(0, key_blocks, tile, init)
    # A query that sees no key gets 0, as in the dense and blocked kernels.
    o_ref[...] = acc / jnp.where(run_sum > 0, run_sum, 1)[:, None]


def _call(q, keys, bias, values, qpos, kpos, c, *, block_q, block_k, compute_dtype):
    on_gpu = jax.default_backend() == "gpu"
    n, m, dv = q.shape[0], keys.shape[0], values.shape[1]
    acc_dtype = jnp.promote_types(jnp.result_type(q, keys, values), jnp.float32)
    side, side_v = _side(q.shape[1]), _side(dv)
    n_pad, m_pad = -(-n // block_q) * block_q, -(-m // block_k) * block_k
    # Padded keys get bias -inf (and an invisible position); padded queries are
    # cut off. Rows are padded as in the blocked kernel.
    pad_rows = blocked.pad_rows
    q = pad_rows(_pad_features(q.astype(acc_dtype), side), block_q, 0)
    keys = pad_rows(_pad_features(keys.astype(acc_dtype), side), block_k, 0)
    values = pad_rows(_pad_features(values.astype(acc_dtype), side_v), block_k, 0)
    bias = pad_rows(bias.astype(acc_dtype), block_k, -jnp.inf)
    c = jnp.ones((), acc_dtype) if c is None else jnp.asarray(c, acc_dtype)
    args = [q, keys, bias, values, jnp.broadcast_to(c, (n_pad,))]
    specs = [
        pl.BlockSpec((block_q, side), lambda i: (i, 0)),
        pl.BlockSpec((m_pad, side), lambda i: (0, 0)),
        pl.BlockSpec((m_pad,), lambda i: (0,)),
        pl.BlockSpec((m_pad, side_v), lambda i: (0, 0)),
        pl.BlockSpec((block_q,), lambda i: (i,)),
    ]
    masked = qpos is not None
    if masked:
        args += [
            pad_rows(qpos.astype(acc_dtype), block_q, 0),
            pad_rows(kpos.astype(acc_dtype), block_k, jnp.inf),
        ]
        specs += [
            pl.BlockSpec((block_q,), lambda i: (i,)),
            pl.BlockSpec((m_pad,), lambda i: (0,)),
        ]
    params = {}
    if on_gpu:
        from jax.experimental.pallas import triton

        params = dict(compiler_params=triton.CompilerParams(num_warps=4, num_stages=2))
    out = pl.pallas_call(
        functools.partial(
            _kernel,
            block_k=block_k,
            key_blocks=m_pad // block_k,
            masked=masked,
            compute_dtype=compute_dtype,
        ),
        out_shape=jax.ShapeDtypeStruct((n_pad, side_v), acc_dtype),
        grid=(n_pad // block_q,),
        in_specs=specs,
        out_specs=pl.BlockSpec((block_q, side_v), lambda i: (i, 0)),
        interpret=not on_gpu,
        name="meanfield_softmax_average",
        **params,
    )(*args)
    return out[:n, :dv]


@functools.partial(jax.custom_jvp, nondiff_argnums=(7,))
def _fused(q, keys, bias, values, qpos, kpos, c, config):
    block_q, block_k, compute_dtype = config
    return _call(
        q,
        keys,
        bias,
        values,
        qpos,
        kpos,
        c,
        block_q=block_q,
        block_k=block_k,
        compute_dtype=compute_dtype,
    )


@_fused.defjvp
def _fused_jvp(config, primals, tangents):
    # Forward-only kernel: differentiate the blocked XLA kernel, which computes
    # the same function. Positions only select keys and c is a power of two
    # (piecewise constant): no tangent flows through either.
    q, keys, bias, values, qpos, kpos, c = primals
    block_q, block_k, _ = config

    def xla(q, keys, bias, values):
        return blocked.softmax_average(
            q,
            keys,
            bias,
            values,
            qpos,
            kpos,
            block_q=block_q,
            block_k=block_k,
            logit_scale=c,
        )

    return jax.jvp(xla, (q, keys, bias, values), tuple(tangents[:4]))


def softmax_average(
    q: Float[Array, "m k"],
    keys: Float[Array, "n k"],
    key_bias: Float[Array, " n"],
    values: Float[Array, "n dv"],
    query_pos: Float[Array, " m"] | None = None,
    key_pos: Float[Array, " n"] | None = None,
    *,
    block_q: int = 64,
    block_k: int = 64,
    compute_dtype: str | None = None,
    logit_scale: Float[Array, ""] | None = None,
) -> Float[Array, "m dv"]:
    """sum_j softmax_j(c^2 (<q_i, k_j> + b_j)) v_j over keys with s_j <= s_i, fused.

    The conventions of `blocked.softmax_average` (-inf bias removes a key, a query
    that sees no key gets 0, c = `logit_scale` or 1), in one Pallas kernel.

    Args:
        q: queries, shape (m, k).
        keys: keys, shape (n, k).
        key_bias: per-key bias, shape (n,).
        values: values, shape (n, dv).
        query_pos: query positions (m,) for a causal mask, or None.
        key_pos: key positions (n,), given with `query_pos`.
        block_q: queries per program (a power of two >= 16).
        block_k: keys per tile (a power of two >= 16).
        compute_dtype: None (products in the inputs' precision) or "bfloat16".
        logit_scale: a power of two c by which the features were divided (huge
            logits), or None.

    Returns:
        Shape (m, dv), float32 (float64 for float64 inputs).

    Raises:
        ValueError: a block size that is not a power of two >= 16, an unknown
            compute_dtype, or one position array without the other.
    """
    for name, size in (("block_q", block_q), ("block_k", block_k)):
        if size < _MIN_SIDE or size & (size - 1):
            raise ValueError(f"`{name}` must be a power of two >= 16; got {size}.")
    if compute_dtype not in (None, "bfloat16"):
        raise ValueError(
            f"`compute_dtype` must be None or 'bfloat16'; got {compute_dtype!r}."
        )
    if (query_pos is None) != (key_pos is None):
        raise ValueError("give both `query_pos` and `key_pos`, or neither.")
    dtype = None if compute_dtype is None else jnp.dtype(compute_dtype)
    return _fused(
        q,
        keys,
        key_bias,
        values,
        query_pos,
        key_pos,
        logit_scale,
        (block_q, block_k, dtype),
    )
