"""Reading and writing BERT weights as Hugging Face safetensors files.

Weights use the Hugging Face `BertModel` tensor names (`encoder.layer.{l}.attention
.self.query.weight`, ...; (out, in) matrices), with or without a prefix such as
`bert.` or `0.auto_model.`; the hyper-parameters come from the `config.json` beside
the weights (`BertConfig.from_json`).
"""

import json
import math
import os
from pathlib import Path

import jax
import jax.numpy as jnp
import jax.random as jr
import numpy as np
from jaxtyping import Array

from .._io import atomic_write_bytes, atomic_write_text
from ._config import CONFIG_NAME, WEIGHTS_NAME, BertConfig
from ._model import BertLayer, BertModel

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
