"""Configuration of `meanfield simulate`: the schema, and attentions built from it.

The `[attention]` table names a registered family (`kind`, any key of
`meanfield._attention.FAMILIES`) and its matrices. What a family accepts is read
from its constructor (`inspect.signature`), not from its name: `A` only where the
constructor takes `A`, `Q`/`K` where it takes them (and by default, as identities,
where it requires them), `sinkhorn_kernel` -> `kernel`, `sinkhorn_max_iter` ->
`max_iter`, `blocking` -> `blocking` where taken. Whether a family accepts masked
(causal) tokens is asked of the family itself: its velocity is traced once, shapes
only, on two masked tokens. So a newly registered family works in a configuration
without changes here.
"""

import inspect

import equinox as eqx
import jax.numpy as jnp
import numpy as np

from .._attention import FAMILIES
from .._attention.base import BLOCKING
from .._dynamics import SOLVERS
from .._measures import MaskedParticles
from . import config as _config
from .config import (
    Key,
    boolean,
    choice,
    integer,
    is_number,
    matrix,
    number,
    optional,
)

INITIALS = ("sphere", "gaussian", "cube")
NORMALIZATIONS = ("sphere", "none", "pre-ln", "peri-ln", "ngpt")
DTYPES = ("float32", "float64")
ANIMATIONS = ("gif", "mp4", "none")
SINKHORN_KERNELS = ("dot", "l2")
#: TOML key of the [attention] table -> keyword of a family's constructor.
KEYWORDS = {
    "A": "A",
    "Q": "Q",
    "K": "K",
    "sinkhorn_kernel": "kernel",
    "sinkhorn_max_iter": "max_iter",
    "blocking": "blocking",
}


def param(rows, cols) -> _config.Check:
    """A number c (meaning c I) or a matrix of shape (rows, cols) (rows None: any).

    `rows` and `cols` are ints, None, or functions of the values resolved so far.
    """
    as_matrix = matrix(rows, cols)

    def check(value, key, cfg):
        if is_number(value):
            r = rows(cfg) if callable(rows) else rows
            c = cols(cfg) if callable(cols) else cols
            if r is not None and r != c:
                raise ValueError(f"`{key}` must be a ({r}, {c}) matrix; got a number.")
            return number()(value, key, cfg)
        return as_matrix(value, key, cfg)

    return check


def _d(cfg) -> int:
    return cfg["d"]


def _k_rows(cfg) -> int:
    # K has as many rows as Q (a number Q is d x d).
    return len(cfg["Q"]) if isinstance(cfg["Q"], list) else cfg["d"]


def _dt0(value, key, cfg):
    if value is None:
        if cfg["solver"] == "euler":
            raise ValueError('`solver` = "euler" needs a fixed step: set `dt0`.')
        return None
    return number(positive=True)(value, key, cfg)


def _segments(value, key, cfg) -> int:
    value = integer(1)(value, key, cfg)
    if value > cfg["saves"] - 1:
        raise ValueError(
            f"`{key}` must be at most `saves` - 1 = {cfg['saves'] - 1}; got {value}."
        )
    return value


#: The configuration: key -> (checker, default); None defaults are documented.
SCHEMA: dict = {
    "n": Key(integer(2), 256),
    "d": Key(integer(1), 3),
    "t1": Key(number(positive=True), 15.0),
    "saves": Key(integer(2), 121),
    "initial": Key(choice(INITIALS), "sphere"),
    "scale": Key(number(positive=True), 1.0),
    "normalization": Key(choice(NORMALIZATIONS), "sphere"),
    "masked": Key(boolean(), False),
    "dtype": Key(choice(DTYPES), "float32"),
    "solver": Key(choice(SOLVERS), "tsit5"),
    "rtol": Key(number(positive=True), 1e-6),
    "atol": Key(number(positive=True), 1e-6),
    # Omitted: adaptive steps; a number: fixed steps of that size.
    "dt0": Key(_dt0),
    "max_steps": Key(integer(1), 100_000),
    "blowup_radius": Key(number(positive=True), 1e8),
    "segments": Key(_segments, 20),
    # Omitted: the automatic tolerance of `mf.clustering`.
    "cluster_tol": Key(optional(number(positive=True))),
    "animation": Key(choice(ANIMATIONS), "gif"),
    "attention": {
        "kind": Key(choice(FAMILIES), "softmax"),
        # A number c means c I; otherwise a (d, d) matrix (Q, K: (k, d)).
        "V": Key(param(_d, _d), 1.0),
        # Omitted: A = I where the family takes A, else Q = K = I.
        "A": Key(optional(param(_d, _d))),
        "Q": Key(optional(param(None, _d))),
        "K": Key(optional(param(_k_rows, _d))),
        "sinkhorn_kernel": Key(choice(SINKHORN_KERNELS), "dot"),
        "sinkhorn_max_iter": Key(integer(0), 1000),
        "blocking": Key(choice(BLOCKING), "auto"),
    },
}


def resolve_config(config: dict | None) -> dict:
    """Validate a configuration and fill in the defaults (`SCHEMA`).

    Keys (all optional): `n` (>= 2), `d` (>= 1), `t1` (> 0), `saves` (>= 2 save
    times, evenly spaced on [0, t1]), `initial` ("sphere" | "gaussian" | "cube"),
    `scale` (> 0: radius of the sphere, standard deviation, half-width),
    `normalization` ("sphere" | "none" | "pre-ln" | "peri-ln" | "ngpt", see
    `mf.simulate`), `masked` (causal attention with
    positions s_i = i/n), `dtype`, `solver`, `rtol`, `atol`, `dt0`, `max_steps`,
    `blowup_radius`, `segments` (checkpoints, >= 1), `cluster_tol` (> 0; default
    automatic), `animation` ("gif" | "mp4" | "none") and an `[attention]` table:
    `kind` (a registered family), `V`, `A` or `Q`/`K` (a number c for c I, or
    matrices), `sinkhorn_kernel`, `sinkhorn_max_iter`, `blocking`.

    Args:
        config: the user's configuration (e.g. parsed TOML); None for defaults.

    Returns:
        The full configuration (plain lists, numbers and strings); the
        `[attention]` table holds `A` or `Q` and `K`, whichever the family uses.

    Raises:
        ValueError: unknown key, wrong type or bad value, or a combination the
            family does not accept; the message (one line) names the key.
    """
    cfg = _config.resolve(SCHEMA, config)
    cfg["attention"] = _finish_attention(cfg["attention"])
    if cfg["masked"]:
        _check_masked(cfg)
    return cfg


def _keywords(kind: str) -> dict[str, inspect.Parameter]:
    """The keyword parameters of the family's constructor, V excepted."""
    params = inspect.signature(FAMILIES[kind]).parameters
    return {name: p for name, p in params.items() if name != "V"}


def _finish_attention(att: dict) -> dict:
    """A or Q/K as the family takes them; the defaults; the family's own needs."""
    kind, takes = att["kind"], _keywords(att["kind"])
    if (att["Q"] is None) != (att["K"] is None):
        raise ValueError("`attention.Q` and `attention.K` must be given together.")
    if att["A"] is not None and att["Q"] is not None:
        raise ValueError("give `attention.A` or `attention.Q`/`attention.K`, not both.")
    # A bilinear score <A x, y> unless the constructor has no A, or its kernel is
    # the L2 one (exp(-|Q x - K y|^2)), which needs Q and K.
    l2_kernel = "kernel" in takes and att["sinkhorn_kernel"] == "l2"
    takes_a = "A" in takes and not l2_kernel
    if att["Q"] is None and not takes_a and "Q" in takes:
        if att["A"] is not None:
            what = "an L2 kernel" if l2_kernel else f'`attention.kind` = "{kind}"'
            raise ValueError(
                f"`attention.A` does not apply to {what}: give `attention.Q` and "
                "`attention.K`."
            )
        att["Q"] = att["K"] = 1.0
    elif att["Q"] is None and takes_a and att["A"] is None:
        att["A"] = 1.0
    for key in ("A", "Q"):
        if att[key] is not None and key not in takes:
            raise ValueError(
                f'`attention.{key}` does not apply to `attention.kind` = "{kind}".'
            )
    given = {KEYWORDS[k] for k, v in att.items() if k in KEYWORDS and v is not None}
    missing = [
        name
        for name, p in takes.items()
        if p.default is inspect.Parameter.empty
        and p.kind is not inspect.Parameter.VAR_KEYWORD
        and name not in given
    ]
    if missing:
        raise ValueError(
            f'`attention.kind` = "{kind}" needs {", ".join(missing)}, which the '
            "[attention] table cannot give."
        )
    # Without the unused of A and Q/K (the manifest shows what the run used).
    return {k: v for k, v in att.items() if v is not None or k not in ("A", "Q", "K")}


def normalization_of(cfg: dict) -> str | None:
    """The `normalization` argument of `mf.simulate` for a configuration's key."""
    return None if cfg["normalization"] == "none" else cfg["normalization"]


def as_matrix(value, d: int) -> np.ndarray:
    """A resolved matrix parameter: a list of rows as is, a number c as c I_d."""
    if isinstance(value, list):
        return np.asarray(value, np.float64)
    return value * np.eye(d)


def build_attention(cfg: dict, dtype):
    """The attention module of a resolved configuration.

    Args:
        cfg: a resolved configuration (`resolve_config`).
        dtype: dtype of the matrices.

    Returns:
        `FAMILIES[kind](V, **keywords)` with the keywords its constructor takes.
    """
    att, d = cfg["attention"], cfg["d"]
    takes = _keywords(att["kind"])
    kwargs = {}
    for key, keyword in KEYWORDS.items():
        if keyword not in takes or att.get(key) is None:
            continue
        value = att[key]
        if key in ("A", "Q", "K"):
            value = jnp.asarray(as_matrix(value, d), dtype)
        kwargs[keyword] = value
    V = jnp.asarray(as_matrix(att["V"], d), dtype)
    return FAMILIES[att["kind"]](V, **kwargs)


def _check_masked(cfg: dict) -> None:
    """Ask the family whether it takes causal tokens: trace its velocity on two."""
    attn = build_attention(cfg, jnp.float32)
    x = jnp.zeros((2, cfg["d"]), jnp.float32)
    measure = MaskedParticles(x, jnp.array([0.0, 0.5], jnp.float32))
    try:
        eqx.filter_eval_shape(lambda a, m: a.velocity(m), attn, measure)
    except ValueError as err:
        kind = cfg["attention"]["kind"]
        raise ValueError(
            f'`attention.kind` = "{kind}" cannot be `masked`: {err}'
        ) from err
