"""Optional packages: imported on first use, never by `import meanfield`.

A bare accelerator image (JAX, diffrax, NumPy, SciPy, ...) runs everything but the
exact and the small-n entropic Wasserstein distances and the BERT tokenizer. When
one of those is called without its package, the error names the package and the
meanfield extra that installs it.
"""

import importlib
import types

#: Top-level module -> (the PyPI package that provides it, the meanfield extra).
OPTIONAL = {
    "ot": ("pot", "ot"),
    "ott": ("ott-jax", "ot"),
    "tokenizers": ("tokenizers", "real-model"),
}


def require(module: str, purpose: str) -> types.ModuleType:
    """Import an optional module, or say which package and extra provide it.

    Args:
        module: dotted module name whose top level is a key of `OPTIONAL`.
        purpose: what needs it, e.g. "the exact W_p (method='exact')".

    Returns:
        The imported module.

    Raises:
        ImportError: the package is not installed; the message names the package
            and the extra.
    """
    package, extra = OPTIONAL[module.partition(".")[0]]
    try:
        return importlib.import_module(module)
    except ImportError as err:
        raise ImportError(
            f"{purpose} needs the `{package}` package, which is not installed "
            f"(importing {module!r} failed: {err}). Install it with "
            f"pip install 'meanfield[{extra}]' (or pip install {package})."
        ) from err
