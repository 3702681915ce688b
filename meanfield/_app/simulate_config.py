"""Configuration of `meanfield simulate`: the schema, and attentions built from it.

The `[attention]` table names a registered family (`kind`, any key of
`meanfield._attention.FAMILIES`) and its matrices. What a family accepts is read
from its constructor (`inspect.signature`), not from its name: `A` only where the
constructor takes `A`, `Q`/`K` where it takes them (and by default, as identities,
where it requires them), `sinkhorn_kernel` -> `kernel`, `sinkhorn_max_iter` ->
`max_iter`, `blocking` -> `blocking` where taken; `slope` and `frequencies` only
for the families that take them (`positional_config`). Whether a family needs,
refuses or takes token positions (`masked`) is asked of the family itself: its
velocity is traced once, shapes only, on two tokens. So a newly registered family
works in a configuration without changes here.

The `[feedforward]` table (`feedforward_config`) adds a token-wise field: the run's
field is then the block `mf.Block(attention, feedforward)`.

The `[noise]` table adds a Brownian forcing of the tokens (`mf.IndependentNoise`
or `mf.CommonNoise`, defined with normalization "none" or "sphere"); `solver`,
`rtol` and `atol` then default to those of a noisy `mf.simulate` (Heun, 1e-3)
instead of the ODE's (Tsit5, 1e-6).
"""

import inspect

import diffrax as dfx
import jax.numpy as jnp

from .._attention import FAMILIES
from .._attention.base import BLOCKING
from .._block import Block
from .._dynamics import SOLVERS
from .._noisy_solve import (
    ODE_TOLERANCE,
    SDE_SOLVERS,
    SDE_TOLERANCE,
    default_tolerance,
)
from . import config as _config
from .config import Key, boolean, choice, integer, number, one_of, optional, or_else
from .feedforward_config import FEEDFORWARD, build_feedforward, finish_feedforward
from .noise_config import check_sigma_in_dtype, is_noisy, noise_table
from .param_config import as_matrix, as_vector, only_for, param
from .positional_config import (
    check_positions,
    frequencies,
    rename,
    slope,
    takes,
)

INITIALS = ("sphere", "gaussian", "cube")
NORMALIZATIONS = ("sphere", "none", "pre-ln", "peri-ln", "ngpt")
DTYPES = ("float32", "float64")
ANIMATIONS = ("gif", "mp4", "none")
SINKHORN_KERNELS = ("dot", "l2")
#: Solvers of a noisy run by name, and those of them that need `dt0`.
SDE_SOLVER_NAMES = tuple(SDE_SOLVERS)
SDE_FIXED_STEP = tuple(
    name
    for name, solver in SDE_SOLVERS.items()
    if not issubclass(solver, dfx.AbstractAdaptiveSolver)
)
# As the reference page writes them: `"euler"`, ... and 1e-6, 1e-3.
_FIXED_NAMES = ", ".join(f'`"{name}"`' for name in SDE_FIXED_STEP)
_ODE_TOL, _SDE_TOL = (
    f"{v:.0e}".replace("e-0", "e-") for v in (ODE_TOLERANCE, SDE_TOLERANCE)
)
#: TOML key of the [attention] table -> keyword of a family's constructor.
KEYWORDS = {
    "A": "A",
    "Q": "Q",
    "K": "K",
    "sinkhorn_kernel": "kernel",
    "sinkhorn_max_iter": "max_iter",
    "blocking": "blocking",
    "slope": "slope",
    "frequencies": "frequencies",
}


def _families(*keywords: str) -> str:
    """The families whose constructor takes one of `keywords`, as the docs list them."""
    return ", ".join(
        f'`"{kind}"`'
        for kind in FAMILIES
        if any(takes(keyword)(kind) for keyword in keywords)
    )


def _d(cfg) -> int:
    return cfg["d"]


def _k_rows(cfg) -> int:
    # K has as many rows as Q (a number Q is d x d).
    return len(cfg["Q"]) if isinstance(cfg["Q"], list) else cfg["d"]


def _solver(value, key, cfg):
    noisy = is_noisy(cfg)
    if value is None:
        return "heun" if noisy else "tsit5"
    names = SDE_SOLVER_NAMES if noisy else SOLVERS
    if not isinstance(value, str) or value not in names:
        what = "with noise (`noise.kind`)" if noisy else "without noise"
        raise ValueError(
            f"`{key}` must be one of {', '.join(names)} {what}; got {value!r}."
        )
    return value


def _tolerance(cfg) -> float:
    return default_tolerance(is_noisy(cfg))


def _dt0(value, key, cfg):
    if value is None:
        fixed = SDE_FIXED_STEP if is_noisy(cfg) else ("euler",)
        if cfg["solver"] in fixed:
            raise ValueError(
                f'`solver` = "{cfg["solver"]}" needs a fixed step: set `dt0`.'
            )
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
    "n": Key(integer(2), 256, doc="Number of tokens, an integer ≥ 2."),
    "d": Key(
        integer(1),
        3,
        doc="Dimension of the tokens (in ℝ^d, or on the sphere S^(d−1)), ≥ 1.",
    ),
    "t1": Key(
        number(positive=True),
        15.0,
        doc="Final time of the dynamics (the depth of the continuous-time "
        "Transformer), > 0.",
    ),
    "saves": Key(
        integer(2),
        121,
        doc="Number of save times, evenly spaced on [0, t1] with both ends, ≥ 2.",
    ),
    "initial": Key(
        choice(INITIALS),
        "sphere",
        doc='Initial tokens: `"sphere"` (uniform on the sphere of radius `scale`), '
        '`"gaussian"` (N(0, scale² I)) or `"cube"` (uniform on [−scale, scale]^d).',
    ),
    "scale": Key(
        number(positive=True),
        1.0,
        doc="Radius, standard deviation or half-width of the initial tokens (see "
        "`initial`), > 0; no effect where `normalization` keeps the tokens on the "
        "unit sphere.",
    ),
    "normalization": Key(
        choice(NORMALIZATIONS),
        "sphere",
        doc='Where the LayerNorm sits: `"sphere"` (post-LN, tokens on the unit '
        'sphere), `"none"` (tokens in ℝ^d), `"pre-ln"` or `"peri-ln"` (free '
        'residual stream, attention sees the directions x/‖x‖) or `"ngpt"` (on the '
        "sphere, normalised attention output).",
    ),
    "masked": Key(
        boolean(),
        False,
        doc="Causal attention: token i attends to the tokens j ≤ i (positions "
        "s_i = i/n); refused for a family that cannot be masked (`sinkhorn`), "
        "required by those that encode positions "
        f"({_families('slope', 'frequencies')}).",
    ),
    "dtype": Key(
        choice(DTYPES),
        "float32",
        doc=f"Floating-point precision of the tokens and matrices: {one_of(DTYPES)}.",
    ),
    "noise": noise_table(
        "Seed of the Brownian path, ≥ 0 (`--seed` draws the initial "
        "tokens): segment k, counted from 0, runs on the path of the key "
        "jax.random.fold_in(jax.random.key(seed), k), so the path depends "
        "on `segments` and a resumed run repeats the uninterrupted one."
    ),
    "solver": Key(
        _solver,
        doc=f'Solver without noise: {one_of(SOLVERS)}, adaptive except `"euler"`; '
        f"with noise: {one_of(SDE_SOLVER_NAMES)}, adaptive except "
        f"{_FIXED_NAMES}. A fixed-step solver needs `dt0`. Omitted: "
        '`"tsit5"`, or `"heun"` with noise.',
    ),
    "rtol": Key(
        or_else(_tolerance, number(positive=True)),
        doc="Relative tolerance of the adaptive step-size control, > 0 (unused "
        f"with fixed steps). Omitted: {_ODE_TOL}, or {_SDE_TOL} with noise.",
    ),
    "atol": Key(
        or_else(_tolerance, number(positive=True)),
        doc="Absolute tolerance of the adaptive step-size control, > 0 (unused "
        f"with fixed steps). Omitted: {_ODE_TOL}, or {_SDE_TOL} with noise.",
    ),
    "dt0": Key(
        _dt0,
        doc="A step size > 0: every solver then takes constant steps of that size. "
        "Omitted: adaptive steps (not allowed with a fixed-step `solver`).",
    ),
    "max_steps": Key(
        integer(1),
        100_000,
        doc="Step budget of each segment, ≥ 1; running out ends the run with "
        "status `max_steps`.",
    ),
    "blowup_radius": Key(
        number(positive=True),
        1e8,
        doc="The run stops with status `blowup` when max_i ‖x_i‖ reaches this "
        "radius, > 0 (and above the initial radius).",
    ),
    "segments": Key(
        _segments,
        20,
        doc="Number of segments the run is cut into, from 1 to `saves` − 1; "
        "`checkpoint.npz` is written after each (see `--resume`).",
    ),
    "cluster_tol": Key(
        optional(number(positive=True)),
        doc="Distance at which tokens count as one cluster (single linkage), > 0. "
        "Omitted: chosen at every save time from the gaps between the merge "
        "heights.",
    ),
    "animation": Key(
        choice(ANIMATIONS),
        "gif",
        doc='Animation of the tokens: `"gif"` (`tokens.gif`), `"mp4"` '
        '(`tokens.mp4`, needs ffmpeg) or `"none"`.',
    ),
    "attention": {
        "kind": Key(
            choice(FAMILIES),
            "softmax",
            doc=f"Attention family: {one_of(FAMILIES)}.",
        ),
        "V": Key(
            param(_d, _d),
            1.0,
            doc="Value matrix: a number c for c I, or a d × d matrix (a list of rows).",
        ),
        "A": Key(
            optional(param(_d, _d)),
            doc="Interaction matrix A = KᵀQ of the score ⟨A x, y⟩: a number c for "
            "c I, or a d × d matrix; not with `Q` and `K`. Omitted: A = I where the "
            "family takes A and `Q`, `K` are not given.",
        ),
        "Q": Key(
            optional(param(None, _d)),
            doc="Query matrix: a number c for c I, or a k × d matrix; given with "
            "`K`, instead of `A`. Omitted: Q = I where the family needs Q and K "
            '(`"l2"`, `"rope"`, or `sinkhorn_kernel = "l2"`), otherwise unused.',
        ),
        "K": Key(
            optional(param(_k_rows, _d)),
            doc="Key matrix, with as many rows as `Q`: a number c for c I, or a "
            "k × d matrix. Omitted: K = I where Q = I is taken (see `Q`).",
        ),
        "sinkhorn_kernel": Key(
            choice(SINKHORN_KERNELS),
            "dot",
            doc='Kernel of the `"sinkhorn"` family: `"dot"` (e^⟨A x, y⟩) or '
            '`"l2"` (e^(−‖Q x − K y‖²), with `Q` and `K`); ignored by the other '
            "families.",
        ),
        "sinkhorn_max_iter": Key(
            integer(0),
            1000,
            doc='Maximum number of Sinkhorn iterations of the `"sinkhorn"` family, '
            "≥ 0 (0 gives softmax attention); ignored by the other families.",
        ),
        "blocking": Key(
            choice(BLOCKING),
            "auto",
            doc='How the n × n interactions are evaluated: `"auto"` (blocked for '
            'large n), `"dense"`, `"blocked"` (memory O(n)) or `"fused"` (one '
            'GPU kernel; not for `"sinkhorn"` and `"hardmax"`); used by '
            f"{_families('blocking')}; ignored by the others.",
        ),
        "slope": Key(
            only_for("attention", takes("slope"), slope),
            doc=f"ALiBi slope of {_families('slope')} (required there, refused "
            "elsewhere): the score of token i for token j gets −slope (s_i − s_j), "
            "positions s_i = i/n, so a discrete slope m per token is slope = m n; "
            "> 0 favours recent tokens. Omitted: only for the other families.",
        ),
        "frequencies": Key(
            only_for("attention", takes("frequencies"), frequencies),
            doc=f"Rotary frequencies ω of {_families('frequencies')} (required "
            "there, refused elsewhere): a list of k/2 numbers for the k rows of `Q` "
            "(k even), or a number ω for every pair; the coordinates (2p, 2p + 1) "
            "of Q x_i and K x_j turn by ω_p s_i and ω_p s_j (s_i = i/n: a discrete "
            "frequency θ per token is ω = θ n). Omitted: only for the other "
            "families.",
        ),
    },
    "feedforward": FEEDFORWARD,
}


def resolve_config(config: dict | None) -> dict:
    """Validate a configuration and fill in the defaults (`SCHEMA`).

    Keys (all optional): `n` (>= 2), `d` (>= 1), `t1` (> 0), `saves` (>= 2 save
    times, evenly spaced on [0, t1]), `initial` ("sphere" | "gaussian" | "cube"),
    `scale` (> 0: radius of the sphere, standard deviation, half-width),
    `normalization` ("sphere" | "none" | "pre-ln" | "peri-ln" | "ngpt", see
    `mf.simulate`), `masked` (causal attention with
    positions s_i = i/n), `dtype`, a `[noise]` table (`kind` "none" |
    "independent" | "common", `sigma` >= 0, `seed` of the Brownian path; noise
    only with normalization "none" or "sphere"), `solver`, `rtol`, `atol` (their
    defaults those of `mf.simulate` with or without noise), `dt0`, `max_steps`,
    `blowup_radius`, `segments` (checkpoints, >= 1), `cluster_tol` (> 0; default
    automatic), `animation` ("gif" | "mp4" | "none") and an `[attention]` table:
    `kind` (a registered family), `V`, `A` or `Q`/`K` (a number c for c I, or
    matrices), `sinkhorn_kernel`, `sinkhorn_max_iter`, `blocking`, `slope`
    ("alibi"), `frequencies` ("rope"); a `[feedforward]` table: `kind` ("none" |
    "affine" | "mlp"), `W`, `b` (affine), `W1`, `b1`, `W2`, `b2`, `activation`
    (mlp).

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
    check_sigma_in_dtype(cfg)
    cfg["attention"] = _finish_attention(cfg["attention"])
    cfg["feedforward"] = finish_feedforward(cfg["feedforward"])
    try:  # what only the constructor checks (k even, blocking of the family)
        attn = build_attention(cfg, jnp.float32)
    except ValueError as err:
        names = {"V": "V", **KEYWORDS}
        raise rename(err, {kw: f"attention.{k}" for k, kw in names.items()}) from err
    check_positions(attn, cfg)
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
    keys = {keyword: key for key, keyword in KEYWORDS.items()}
    if [name for name in missing if name in keys]:
        names = [f"`attention.{keys[name]}`" for name in missing if name in keys]
        raise ValueError(f'`attention.kind` = "{kind}" needs {" and ".join(names)}.')
    if missing:
        raise ValueError(
            f'`attention.kind` = "{kind}" needs {", ".join(missing)}, which the '
            "[attention] table cannot give."
        )
    # Without the keys the family does not use (the manifest shows what ran).
    return {k: v for k, v in att.items() if v is not None}


def normalization_of(cfg: dict) -> str | None:
    """The `normalization` argument of `mf.simulate` for a configuration's key."""
    return None if cfg["normalization"] == "none" else cfg["normalization"]


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
        elif key == "slope":
            value = jnp.asarray(value, dtype)
        elif key == "frequencies":  # k/2 of them, k the rows of Q (= d for c I)
            value = jnp.asarray(as_vector(value, kwargs["Q"].shape[0] // 2), dtype)
        kwargs[keyword] = value
    V = jnp.asarray(as_matrix(att["V"], d), dtype)
    return FAMILIES[att["kind"]](V, **kwargs)


def build_field(cfg: dict, dtype):
    """The velocity field of a run: the attention, or the block with `[feedforward]`.

    Args:
        cfg: a resolved configuration (`resolve_config`).
        dtype: dtype of the parameters.

    Returns:
        `build_attention(cfg, dtype)`, or `mf.Block(attention, feedforward)` when
        `feedforward.kind` is not "none".
    """
    attn = build_attention(cfg, dtype)
    ff = build_feedforward(cfg, dtype)
    return attn if ff is None else Block(attn, ff)
