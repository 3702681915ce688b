"""How the Lipschitz constant of attention grows with n, with figures.

`meanfield lipschitz`: Castin, Ablin & Peyre, "How Smooth Is Attention?" (ICML
2024). For one softmax head (A, V) on the ball B_R, measures the local Lipschitz
constant at random inputs, at the configuration of Prop. 3.4 and at the inputs of a
gradient search, for a range of n, beside the upper bound (Thm 3.3) and the lower
bound (Prop. 3.4), and fits log-log slopes (sqrt(n) growth: slope 1/2). Optionally
(`[real_model]`) measures every attention layer of the pretrained
all-MiniLM-L6-v2 on English text against the sequence length (their Fig. 1).

Run it with `meanfield lipschitz [--config FILE.toml]`.
"""

import importlib.util
from pathlib import Path

import jax
import jax.numpy as jnp
import jax.random as jr
import numpy as np

from .. import bert, plotting
from .._attention.softmax import SoftmaxAttention
from ..lipschitz._study import real_model_study, scaling_study
from . import config as _config
from .config import (
    Key,
    boolean,
    choice,
    int_list,
    integer,
    matrix,
    number,
    one_of,
    optional,
    or_else,
    square,
)
from .lipschitz_summary import format_summary, summarize_study
from .report import Output, Report, Result, format_matrix

DTYPES = ("float32", "float64")

#: The configuration: key -> (checker, default).
SCHEMA: dict = {
    "A": Key(
        square(),
        [[-1.0, 0.0], [0.0, -1.0]],
        doc="Interaction matrix of the softmax head (score ⟨A x, y⟩): d × d for "
        "any d ≥ 1, which sets the dimension of the tokens.",
    ),
    "V": Key(
        or_else(
            lambda cfg: np.eye(len(cfg["A"])).tolist(),
            matrix(lambda cfg: len(cfg["A"]), lambda cfg: len(cfg["A"])),
        ),
        doc="Value matrix, d × d with the d of `A`. Omitted: the d × d identity.",
    ),
    "R": Key(
        number(positive=True),
        3.0,
        doc="Radius of the ball B_R that holds every token, > 0.",
    ),
    "ns": Key(
        int_list(2, min_len=2),
        [16, 32, 64, 128, 256, 512, 1024, 2048],
        doc="Numbers of tokens n at which the constant is measured and the "
        "log-log slopes fitted: at least two strictly increasing integers ≥ 2.",
    ),
    "search": {
        "max_n": Key(
            integer(0),
            64,
            doc="The gradient search for the largest constant runs at every n ≤ "
            "max_n of `ns`, ≥ 0 (0: no search).",
        ),
        "restarts": Key(
            integer(1),
            2,
            doc="Random starts of the search, ≥ 1; one more starts from the "
            "configuration of Castin, Ablin & Peyré (Prop. 3.4).",
        ),
        "steps": Key(integer(1), 400, doc="Projected Adam steps per start, ≥ 1."),
        "inner": Key(
            integer(1),
            3,
            doc="Power iterations per step that refresh the top singular vector of "
            "the Jacobian, ≥ 1.",
        ),
        "learning_rate": Key(
            or_else(lambda cfg: 0.02 * cfg["R"], number(positive=True)),
            doc="Adam step size, > 0. Omitted: 0.02 R.",
        ),
    },
    "real_model": {
        "enabled": Key(
            boolean(),
            False,
            doc="Also measure every attention layer of the pretrained "
            "all-MiniLM-L6-v2 on English text against the sequence length "
            "(`real_model.png`); needs the optional model (`meanfield "
            "install-model`), otherwise a configuration error.",
        ),
        "lengths": Key(
            int_list(1, min_len=2),
            [16, 32, 64, 128, 256],
            doc="Sequence lengths n (the first n word pieces of the text): at least "
            "two strictly increasing integers ≥ 1, at most the model's 512 "
            "positions.",
        ),
        "layers": Key(
            optional(int_list(0)),
            doc="Layers to measure: strictly increasing indices from 0 to 5 (the "
            "model has 6 layers). Omitted: every layer.",
        ),
        "dtype": Key(
            choice(DTYPES),
            "float64",
            doc=f"Precision of the model and of the measurements: {one_of(DTYPES)}.",
        ),
        "masked": Key(
            boolean(),
            False,
            doc="Measure the same layers under a causal mask (positions s_i = i/n), "
            "the decoder setting.",
        ),
    },
}

#: Lanczos settings of every local constant (those of `mf.lipschitz.local`).
LOCAL = {
    "method": "lanczos",
    "tol": 1e-8,
    "rtol": 1e-13,
    "max_iter": 2000,
    "krylov": 16,
}
INSTALL_HINT = "run `meanfield install-model`"


def resolve_config(config: dict | None) -> dict:
    """Validate a configuration and fill in the defaults (`SCHEMA`).

    Keys (all optional): `A` (d x d, default -I in d = 2), `V` (d x d, default
    I), `R` (> 0), `ns` (increasing integers >= 2, at least two), a `search` table
    (`max_n` >= 0, 0 for no search; `restarts`, `steps`, `inner` >= 1;
    `learning_rate` > 0, default 0.02 R) and a `real_model` table (`enabled`,
    `lengths` (increasing integers >= 1, at least two), `layers` (indices; default
    all), `dtype` "float32" or "float64", `masked`: a causal mask, the decoder
    experiment).

    Args:
        config: the user's configuration (e.g. parsed TOML); None for defaults.

    Returns:
        The full configuration (plain lists, ints and floats).

    Raises:
        ValueError: unknown key, wrong type or bad value; the message (one line)
            names the key.
    """
    return _config.resolve(SCHEMA, config)


def _tokenizers_installed() -> bool:
    return importlib.util.find_spec("tokenizers") is not None


def check_real_model(config: dict) -> "bert.PretrainedPaths | None":
    """The pretrained files when `[real_model]` is enabled; check its keys against them.

    Args:
        config: a resolved configuration (`resolve_config`).

    Returns:
        The paths of all-MiniLM-L6-v2, or None when `real_model.enabled` is false.

    Raises:
        ValueError: enabled but the extra is not installed (the message says how to
            install it), or `lengths` / `layers` beyond the model.
    """
    real = config["real_model"]
    if not real["enabled"]:
        return None
    paths = bert.find_pretrained()
    if paths is None or not _tokenizers_installed():
        raise ValueError(
            "`real_model.enabled = true` needs the pretrained all-MiniLM-L6-v2 and "
            f"the `tokenizers` package, which are not installed: {INSTALL_HINT}."
        )
    c = bert.BertConfig.from_json(paths.config)
    if real["lengths"][-1] > c.max_positions:
        raise ValueError(
            f"`real_model.lengths` must be <= {c.max_positions} (the model's "
            f"positions); got {real['lengths'][-1]}."
        )
    if real["layers"] is not None and real["layers"][-1] >= c.num_layers:
        raise ValueError(
            f"`real_model.layers` must be indices in [0, {c.num_layers}); got "
            f"{real['layers']}."
        )
    return paths


def run_lipschitz(
    config: dict | None,
    out_dir: str | Path = "out/lipschitz",
    *,
    seed: int | None = None,
    progress: bool = False,
) -> dict:
    """Lipschitz constant of one softmax head against n; optionally a real model.

    `mf.lipschitz.scaling_study` of `SoftmaxAttention(V, A=A)` on B_R for every n in
    `ns` (random inputs, the Prop. 3.4 configuration, the gradient search for n <=
    `search.max_n`, both bounds), in float64 inside the scoped, thread-local
    `jax.enable_x64(True)` (the caller's setting is untouched; Lanczos reaches its
    1e-8 residual there). With `[real_model] enabled = true`,
    `mf.lipschitz.real_model_study` of all-MiniLM-L6-v2 on the first n word pieces
    of `mf.bert.english_text()`.

    Writes to `out_dir` (created if needed): `lipschitz.png`, `lipschitz.npz`
    (`ns`, `random`, `random_converged`, `searched`, `searched_converged`,
    `wall_s` and, where defined, `adversarial`, `adversarial_converged`,
    `upper`, `lower`; with the real model `real_model_lengths`,
    `real_model_layers`, `real_model_values` (layers, lengths),
    `real_model_converged`, `real_model_slopes`, `real_model_wall_s`), with the
    real model `real_model.png`, and `manifest.json` (full configuration, seed,
    versions, device, wall time, summary).

    Args:
        config: configuration (see `resolve_config`); None for the defaults.
        out_dir: output directory.
        seed: PRNG seed of the random inputs and of the search (None: 0).
        progress: progress bars and a line per stage on stderr.

    Returns:
        The summary (see `format_summary`).

    Raises:
        ValueError: invalid configuration (the message names the key), or the real
            model requested but not installed.
    """
    return REPORT.run(resolve_config(config), out_dir, seed=seed, progress=progress)


def _compute(cfg: dict, output: Output, *, seed: int | None = None) -> Result:
    """The scaling study (and the real model), in float64."""
    paths = check_real_model(cfg)
    search = dict(cfg["search"])
    max_n = search.pop("max_n")
    real_cfg = dict(cfg["real_model"])
    with jax.enable_x64(True):
        f64 = jnp.float64
        attn = SoftmaxAttention(
            jnp.asarray(cfg["V"], f64), A=jnp.asarray(cfg["A"], f64)
        )
        output.log(f"scaling study: n = {cfg['ns'][0]}..{cfg['ns'][-1]}")
        study = scaling_study(
            attn,
            cfg["ns"],
            cfg["R"],
            key=jr.key(0 if seed is None else seed),
            search_max_n=max_n,
            search_kwargs=search,
            progress=output.progress,
        )
        real = None
        if paths is not None:
            dtype = jnp.dtype(real_cfg["dtype"])
            model = bert.load(paths.weights, dtype=dtype)
            if real_cfg["layers"] is None:
                real_cfg["layers"] = list(range(model.config.num_layers))
            ids = bert.tokenize(
                bert.english_text(),
                paths.tokenizer,
                max_length=real_cfg["lengths"][-1],
            )
            output.log(f"real model: {len(real_cfg['layers'])} layers")
            real = real_model_study(
                model,
                ids,
                real_cfg["lengths"],
                layers=real_cfg["layers"],
                progress=output.progress,
                masked=real_cfg["masked"],
            )

    arrays = {
        "ns": study.ns,
        "random_converged": study.random_converged,
        "searched_converged": study.searched_converged,
        "wall_s": study.wall_s,
        **study.series(),
    }
    if study.adversarial_converged is not None:
        arrays["adversarial_converged"] = study.adversarial_converged
    if real is not None:
        arrays.update(
            real_model_lengths=real.lengths,
            real_model_layers=real.layers,
            real_model_values=real.values,
            real_model_converged=real.converged,
            real_model_slopes=real.slopes,
            real_model_wall_s=real.wall_s,
        )
    resolved = {
        **cfg,
        "real_model": real_cfg,
        "out_dir": str(output.dir),
        "d": len(cfg["A"]),
        "dtype": "float64",
        "attention": "SoftmaxAttention(V, A=A)",
        "random_inputs": "N(0, R^2/d I) projected on B_R, key fold_in(seed, n)",
        "local": LOCAL,
    }
    if paths is not None:
        resolved["real_model"].update(
            model="all-MiniLM-L6-v2",
            weights=str(paths.weights),
            text="mf.bert.english_text(), first n word pieces",
        )
    summary = summarize_study(cfg, study, real)
    return Result(summary, resolved, arrays, {"study": study, "real": real})


def _figures(cfg: dict, result: Result, output: Output) -> None:
    """lipschitz.png, and real_model.png with the real model."""
    output.figure(
        plotting.plot_lipschitz_scaling(
            result.data["study"],
            title=(
                f"softmax attention, A = {format_matrix(cfg['A'])}, "
                f"V = {format_matrix(cfg['V'])}, R = {cfg['R']:g}"
            ),
        ),
        "lipschitz.png",
        bbox_inches="tight",
    )
    real = result.data["real"]
    if real is not None:
        output.figure(
            plotting.plot_real_model_lipschitz(
                real,
                title=f"all-MiniLM-L6-v2 attention layers ({real.dtype}"
                + (", causal mask)" if real.masked else ")"),
            ),
            "real_model.png",
            bbox_inches="tight",
        )


#: `meanfield lipschitz`: a requested real model that is not installed is a
#: configuration error.
REPORT = Report(
    "lipschitz",
    resolve_config,
    _compute,
    _figures,
    format_summary,
    arrays="lipschitz.npz",
    check=lambda cfg, args: check_real_model(cfg),
)
