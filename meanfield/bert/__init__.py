"""BERT-family encoders from safetensors, attention layers as meanfield attention.

For Lipschitz measurements on real models (Castin, Ablin & Peyre, ICML 2024, Fig. 1).

Public namespace `mf.bert`. The pretrained all-MiniLM-L6-v2 is optional (the
command `meanfield install-model` installs it); tests use `save_random` models in
the same format.
"""

from ._attention import BertHeadAttention, attention_layer, attention_offset
from ._config import CONFIG_NAME, TOKENIZER_NAME, WEIGHTS_NAME, BertConfig
from ._model import BertModel, embed, hidden_states
from ._pretrained import PretrainedPaths, english_text, find_pretrained, tokenize
from ._weights import load, save_random

__all__ = [
    "CONFIG_NAME",
    "TOKENIZER_NAME",
    "WEIGHTS_NAME",
    "BertConfig",
    "BertHeadAttention",
    "BertModel",
    "PretrainedPaths",
    "attention_layer",
    "attention_offset",
    "embed",
    "english_text",
    "find_pretrained",
    "hidden_states",
    "load",
    "save_random",
    "tokenize",
]
