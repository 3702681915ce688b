"""The `[feedforward]` table of `meanfield simulate`: the second half of a block.

With `kind` = "affine" (F(x) = W x + b, `mf.FeedForward`) or "mlp"
(F(x) = W2 sigma(W1 x + b1) + b2, `mf.MLP`) the run's field is the Transformer
block `mf.Block(attention, F)`, x' = Gamma_mu(x) + F(x); `kind` = "none" (the
default) keeps the attention alone. A key of one kind given with another is an
error, so a file says exactly what runs.
"""

import jax.numpy as jnp

from .._feedforward import ACTIVATIONS, MLP, FeedForward
from .config import Key, choice, one_of
from .param_config import as_matrix, as_vector, only_for, param, vector

#: `[feedforward] kind` -> the keys it takes, those it requires first.
FEEDFORWARDS = {
    "none": (),
    "affine": ("W", "b"),
    "mlp": ("W1", "W2", "b1", "b2", "activation"),
}
REQUIRED = {"affine": ("W",), "mlp": ("W1", "W2")}


def _of(name: str, check):
    return only_for("feedforward", lambda kind: name in FEEDFORWARDS[kind], check)


def _d(cfg) -> int:
    return cfg["d"]


def _p(cfg) -> int:
    # Hidden units: the rows of W1 (a number W1 is c I, p = d).
    return len(cfg["W1"]) if isinstance(cfg["W1"], list) else cfg["d"]


#: The [feedforward] table: key -> `Key` (all but `kind` default to None).
FEEDFORWARD: dict = {
    "kind": Key(
        choice(FEEDFORWARDS),
        "none",
        doc="Token-wise field F added to the attention, the Transformer block "
        'x′ = Γ_μ(x) + F(x): `"none"` (attention alone), `"affine"` '
        '(F(x) = W x + b) or `"mlp"` (F(x) = W2 σ(W1 x + b1) + b2).',
    ),
    "W": Key(
        _of("W", param(_d, _d)),
        doc='W of `"affine"` (and only there): a number c for c I or a d × d matrix. '
        'Omitted: refused with `kind` = `"affine"`.',
    ),
    "b": Key(
        _of("b", vector(_d, "d")),
        doc='b of `"affine"` (and only there): a number c for (c, …, c) or a list '
        "of d numbers. Omitted: 0.",
    ),
    "W1": Key(
        _of("W1", param(None, _d)),
        doc='W1 of `"mlp"` (and only there): a p × d matrix (p hidden units) or a '
        'number c for c I (p = d). Omitted: refused with `kind` = `"mlp"`.',
    ),
    "b1": Key(
        _of("b1", vector(_p, "p")),
        doc='b1 of `"mlp"` (and only there): a number c for (c, …, c) or a list of '
        "p numbers. Omitted: 0.",
    ),
    "W2": Key(
        _of("W2", param(_d, _p)),
        doc='W2 of `"mlp"` (and only there): a d × p matrix (the p of `W1`) or a '
        'number c for c I (p = d). Omitted: refused with `kind` = `"mlp"`.',
    ),
    "b2": Key(
        _of("b2", vector(_d, "d")),
        doc='b2 of `"mlp"` (and only there): a number c for (c, …, c) or a list of '
        "d numbers. Omitted: 0.",
    ),
    "activation": Key(
        _of("activation", choice(ACTIVATIONS)),
        doc=f'Activation σ of `"mlp"` (and only there): {one_of(ACTIVATIONS)} '
        '(gelu in its exact erf form). Omitted: `"relu"`.',
    ),
}


def finish_feedforward(ff: dict) -> dict:
    """The required keys given, `activation` filled in, the unused keys dropped.

    Raises:
        ValueError: a key the kind requires is missing (one line naming it).
    """
    kind = ff["kind"]
    missing = [f"`feedforward.{k}`" for k in REQUIRED.get(kind, ()) if ff[k] is None]
    if missing:
        needs = " and ".join(missing)
        raise ValueError(f'`feedforward.kind` = "{kind}" needs {needs}.')
    if kind == "mlp" and ff["activation"] is None:
        ff["activation"] = "relu"
    return {k: v for k, v in ff.items() if v is not None}


def build_feedforward(cfg: dict, dtype):
    """The feed-forward field of a resolved configuration (None for "none").

    Args:
        cfg: a resolved configuration (its `d` and `[feedforward]` table).
        dtype: dtype of the parameters.

    Returns:
        `mf.FeedForward(W, b)`, `mf.MLP(W1, b1, W2, b2, activation)` or None; an
        omitted bias is None (zero).
    """
    ff, d = cfg["feedforward"], cfg["d"]
    kind = ff["kind"]
    if kind == "none":
        return None

    def mat(key):
        return jnp.asarray(as_matrix(ff[key], d), dtype)

    def vec(key, size):
        return None if key not in ff else jnp.asarray(as_vector(ff[key], size), dtype)

    if kind == "affine":
        return FeedForward(mat("W"), vec("b", d))
    W1 = mat("W1")
    return MLP(W1, vec("b1", W1.shape[0]), mat("W2"), vec("b2", d), ff["activation"])
