"""The BERT encoder as an equinox Module and its forward pass in JAX.

A post-LN encoder (all-MiniLM-L6-v2: 6 layers, 12 heads, hidden size 384) run on
one unpadded sequence: embeddings, then per layer x <- LN(x + attention(x)) and
x <- LN(x + FF(x)) with exact GELU, scanned over the stacked layers.
"""

import math

import equinox as eqx
import jax
import jax.numpy as jnp
from jaxtyping import Array, ArrayLike, Float, Int

from .._checks import check_values
from ._config import BertConfig


class BertLayer(eqx.Module):
    """Parameters of one post-LN encoder layer (matrices in (out, in) layout).

    In `BertModel.layers` every field carries a leading layer axis L.
    """

    query_w: Float[Array, "*L h h"]
    query_b: Float[Array, "*L h"]
    key_w: Float[Array, "*L h h"]
    key_b: Float[Array, "*L h"]
    value_w: Float[Array, "*L h h"]
    value_b: Float[Array, "*L h"]
    out_w: Float[Array, "*L h h"]
    out_b: Float[Array, "*L h"]
    attn_ln_w: Float[Array, "*L h"]
    attn_ln_b: Float[Array, "*L h"]
    ff_in_w: Float[Array, "*L i h"]
    ff_in_b: Float[Array, "*L i"]
    ff_out_w: Float[Array, "*L h i"]
    ff_out_b: Float[Array, "*L h"]
    ff_ln_w: Float[Array, "*L h"]
    ff_ln_b: Float[Array, "*L h"]


class BertModel(eqx.Module):
    """A post-LN BERT encoder (no pooler): embeddings and L stacked layers.

    Build it with `load`; run it with `hidden_states`.

    Attributes:
        config: the hyper-parameters (static).
        word: word-piece embeddings (vocab, h).
        position: absolute position embeddings (max_positions, h).
        token_type: token-type embeddings (types, h); only type 0 is used.
        ln_w: scale of the embedding LayerNorm (h,).
        ln_b: shift of the embedding LayerNorm (h,).
        layers: every layer's parameters, stacked along a leading axis L.
    """

    config: BertConfig = eqx.field(static=True)
    word: Float[Array, "vocab h"]
    position: Float[Array, "P h"]
    token_type: Float[Array, "types h"]
    ln_w: Float[Array, " h"]
    ln_b: Float[Array, " h"]
    layers: BertLayer


def _layer_norm(x, w, b, eps):
    mean = jnp.mean(x, axis=-1, keepdims=True)
    var = jnp.mean((x - mean) ** 2, axis=-1, keepdims=True)
    return (x - mean) / jnp.sqrt(var + eps) * w[None, :] + b[None, :]


def _dense(x, w, b):
    return x @ w.T + b[None, :]


def _self_attention(layer: BertLayer, x, c: BertConfig):
    """BERT's attention sublayer output W_O concat_h(softmax(q k^T) v) + b_O."""
    n, heads, dh = x.shape[0], c.num_heads, c.head_dim
    q, k, v = (
        _dense(x, w, b).reshape(n, heads, dh)
        for w, b in (
            (layer.query_w, layer.query_b),
            (layer.key_w, layer.key_b),
            (layer.value_w, layer.value_b),
        )
    )
    logits = jnp.einsum("ihe,jhe->hij", q, k) / math.sqrt(dh)
    mixed = jnp.einsum("hij,jhe->ihe", jax.nn.softmax(logits, axis=-1), v)
    return _dense(mixed.reshape(n, heads * dh), layer.out_w, layer.out_b)


def _layer_forward(layer: BertLayer, x, c: BertConfig):
    eps = c.layer_norm_eps
    x = _layer_norm(
        x + _self_attention(layer, x, c), layer.attn_ln_w, layer.attn_ln_b, eps
    )
    ff = jax.nn.gelu(_dense(x, layer.ff_in_w, layer.ff_in_b), approximate=False)
    ff = _dense(ff, layer.ff_out_w, layer.ff_out_b)
    return _layer_norm(x + ff, layer.ff_ln_w, layer.ff_ln_b, eps)


def _check_ids(c: BertConfig, input_ids) -> Int[Array, " n"]:
    ids = jnp.asarray(input_ids)
    if not jnp.issubdtype(ids.dtype, jnp.integer):
        raise ValueError(f"`input_ids` must be integers; got dtype {ids.dtype}.")
    if ids.ndim != 1 or not 1 <= ids.shape[0] <= c.max_positions:
        raise ValueError(
            "`input_ids` must have shape (n,) with 1 <= n <= max_positions = "
            f"{c.max_positions}; got shape {ids.shape}."
        )
    # JAX clamps out-of-range gathers silently: reject them instead.
    (ids,) = check_values(
        (ids,),
        jnp.any((ids < 0) | (ids >= c.vocab_size)),
        f"`input_ids` must lie in [0, vocab_size = {c.vocab_size}).",
    )
    return ids


def embed(model: BertModel, input_ids: ArrayLike) -> Float[Array, "n h"]:
    """Input of the first layer: LayerNorm(word + position + token type 0).

    Args:
        model: the encoder.
        input_ids: token ids (n,) of one unpadded sequence.

    Raises:
        ValueError: ids that are not integers, out of the vocabulary, or a
            sequence longer than `max_positions` (under jit the range check is a
            runtime error).
    """
    c = model.config
    ids = _check_ids(c, input_ids)
    n = ids.shape[0]
    x = model.word[ids] + model.position[:n] + model.token_type[0][None, :]
    return _layer_norm(x, model.ln_w, model.ln_b, c.layer_norm_eps)


def hidden_states(model: BertModel, input_ids: ArrayLike) -> Float[Array, "L+1 n h"]:
    """Forward pass of one unpadded sequence, keeping every layer's input.

    Args:
        model: the encoder.
        input_ids: token ids (n,), e.g. from `tokenize` (with [CLS] ... [SEP]).

    Returns:
        Shape (L + 1, n, h): index l < L is the input of layer l (0: the
        embeddings), index L the encoder's output.

    Raises:
        ValueError: as `embed`.
    """
    c = model.config

    def step(x, layer):
        return _layer_forward(layer, x, c), x

    # scan: compile time independent of the depth.
    last, inputs = jax.lax.scan(step, embed(model, input_ids), model.layers)
    return jnp.concatenate([inputs, last[None]], axis=0)
