"""BERT's attention layers as meanfield attention.

Castin, Ablin & Peyré, "How Smooth Is Attention?" (ICML 2024), Fig. 1, measure the
local Lipschitz constant of every self-attention layer of a pretrained BERT on real
text. Each layer's attention is exposed as a `MultiHeadAttention` of softmax heads
(`BertHeadAttention`) whose velocity on the layer's input tokens is the attention
sublayer's output minus a constant (`attention_offset`).
"""

import math

import equinox as eqx
import jax
import jax.numpy as jnp
from jaxtyping import Array, Float

from .._attention.base import (
    AbstractKernelAttention,
    bilinear_features,
    check_blocking,
    init_params,
    param_at,
)
from .._attention.multihead import MultiHeadAttention
from .._custom_types import Param, ParamLike
from .._params import as_param
from ._model import BertLayer, BertModel


class BertHeadAttention(AbstractKernelAttention):
    """One BERT attention head as a softmax attention on R^d.

    logits l_ij = <Q z_i + b_Q, K x_j> / sqrt(k) and Gamma(z_i) =
    sum_j softmax_j(l_ij) V x_j: the softmax attention of Castin et al. (2024)
    with BERT's query bias and 1/sqrt(k) scaling.

    Args:
        V: value map (d, d), or a function of t.
        Q: the head's query rows W_Q^h (k, d).
        K: the head's key rows W_K^h (k, d).
        q_bias: the head's query bias b_Q^h (k,); None for none.
        blocking: "auto" (blocked above 2048^2 query-key pairs), "dense",
            "blocked" (O(block_size^2) memory, `_blocked`) or "fused" (one Pallas
            kernel, `_kernels.fused`: Triton on a GPU, interpreted elsewhere;
            derivatives through the blocked kernel).
        block_size: keys per block of the blocked kernel (queries: 4x as many).

    Raises:
        ValueError: shapes that do not match.
    """

    V: Param
    Q: Param
    K: Param
    q_bias: Param | None
    blocking: str = eqx.field(static=True)
    block_size: int = eqx.field(static=True)

    def __init__(
        self,
        V: ParamLike,
        *,
        Q: ParamLike,
        K: ParamLike,
        q_bias: ParamLike | None = None,
        blocking: str = "auto",
        block_size: int = 512,
    ):
        self.V, _, self.Q, self.K = init_params(V, None, Q, K, "BertHeadAttention")
        self.blocking, self.block_size = check_blocking(blocking, block_size)
        self.q_bias = as_param(q_bias, "q_bias")
        if not (self.q_bias is None or callable(self.q_bias) or callable(self.Q)):
            param_at(self.q_bias, 0.0, "q_bias", (self.Q.shape[0],))

    def features(self, z, x, t):
        """((Q z + b_Q) / sqrt(k), K x, None).

        The key bias b_K of BERT adds <Q z_i + b_Q, b_K> to row i of the logits, a
        per-query constant that cancels in the softmax, so it is left out.
        """
        qz, kx = bilinear_features(None, self.Q, self.K, t, z, x)
        k = qz.shape[-1]
        if self.q_bias is not None:
            qz = qz + param_at(self.q_bias, t, "q_bias", (k,))[None, :]
        return qz / math.sqrt(k), kx, None


def _layer_params(model: BertModel, l: int) -> BertLayer:
    num = model.config.num_layers
    if isinstance(l, bool) or not isinstance(l, int) or not 0 <= l < num:
        raise ValueError(f"`l` must be a layer index in [0, {num}); got {l!r}.")
    return jax.tree.map(lambda a: a[l], model.layers)


def attention_layer(model: BertModel, l: int) -> MultiHeadAttention:
    """Layer l's self-attention as a meanfield multi-head attention.

    Head h has V_h = W_V with only head h's rows kept (d, d) and output matrix
    W_h = W_O with only head h's columns kept (d, d), so sum_h W_h Gamma^(h) =
    W_O concat_h(Gamma^(h)). On `Particles(x)` (uniform weights), with x the
    layer's input, the velocity plus `attention_offset(model, l)` is BERT's
    attention sublayer output (before the residual and LayerNorm).

    Args:
        model: the encoder.
        l: layer index in [0, L).

    Raises:
        ValueError: `l` out of range.
    """
    p, c = _layer_params(model, l), model.config
    heads, outs = [], []
    for h in range(c.num_heads):
        rows = slice(h * c.head_dim, (h + 1) * c.head_dim)
        keep = jnp.zeros(c.hidden_size, p.value_w.dtype).at[rows].set(1)
        heads.append(
            BertHeadAttention(
                p.value_w * keep[:, None],
                Q=p.query_w[rows],
                K=p.key_w[rows],
                q_bias=p.query_b[rows],
            )
        )
        outs.append(p.out_w * keep[None, :])
    return MultiHeadAttention(heads, outs)


def attention_offset(model: BertModel, l: int) -> Float[Array, " h"]:
    """W_O b_V + b_O: the constant the value and output biases add (h,).

    Softmax weights sum to one, so b_V passes through every head unchanged.

    Raises:
        ValueError: `l` out of range.
    """
    p = _layer_params(model, l)
    return p.out_w @ p.value_b + p.out_b
