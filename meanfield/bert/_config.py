"""Hyper-parameters of a BERT encoder and the file names of its package.

The hyper-parameters come from the Hugging Face `config.json` beside the weights:
the number of heads cannot be read off the tensor shapes.
"""

import dataclasses
import json
import os

WEIGHTS_NAME = "model.safetensors"
CONFIG_NAME = "config.json"
TOKENIZER_NAME = "tokenizer.json"

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
