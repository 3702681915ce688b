"""Particle dynamics from a configuration, checkpointed (`meanfield simulate`).

Tokens start uniform on the sphere, Gaussian or uniform in a cube; any attention
family moves them, on the sphere (the LayerNorm model of Geshkovski, Letrouit,
Polyanskiy & Rigollet, 2023) or in R^d, optionally causal (`masked`). The run is
cut into `segments` solves of equal numbers of save times; after each one the
state is written atomically to `checkpoint.npz`, so an interrupted run continues
with `--resume`. A run is always cut the same way, so a resumed run and an
uninterrupted one compute exactly the same solves and end in the same state.

Run it with `meanfield simulate [--config FILE.toml] [--resume]`.
"""

import dataclasses
import json
import math
import sys
import time
from pathlib import Path

import equinox as eqx
import jax
import jax.numpy as jnp
import jax.random as jr
import matplotlib.pyplot as plt
import numpy as np
from tqdm.auto import tqdm

from .. import _io, _status, plotting
from .._attention.ill_posed import (
    LinearAttention,
    ReLUAttention,
    SigmoidAttention,
    UnnormalizedAttention,
)
from .._attention.l2 import L2Attention
from .._attention.sinkhorn import SinkhornAttention
from .._attention.softmax import SoftmaxAttention
from .._dynamics import SOLVERS, Solution, simulate
from .._measures import MaskedParticles, Particles
from ..clustering import _clustering
from .config import check_keys, integer, is_number, matrix, number, short

DEFAULTS: dict = {
    "n": 256,
    "d": 3,
    "t1": 15.0,
    "saves": 121,
    "initial": "sphere",
    "scale": 1.0,
    "normalization": "sphere",
    "masked": False,
    "dtype": "float32",
    "solver": "tsit5",
    "rtol": 1e-6,
    "atol": 1e-6,
    # None (key omitted): adaptive steps; a number: fixed steps of that size.
    "dt0": None,
    "max_steps": 100_000,
    "blowup_radius": 1e8,
    "segments": 20,
    # None: the automatic tolerance of `mf.clustering`.
    "cluster_tol": None,
    "animation": "gif",
    "attention": {
        "kind": "softmax",
        # A number c means c I; otherwise a (d, d) matrix (Q, K: (k, d)).
        "V": 1.0,
        # None: A = I unless Q and K are given.
        "A": None,
        "Q": None,
        "K": None,
        "sinkhorn_kernel": "dot",
        "sinkhorn_max_iter": 1000,
        "blocking": "auto",
    },
}

INITIALS = ("sphere", "gaussian", "cube")
NORMALIZATIONS = ("sphere", "none")
DTYPES = ("float32", "float64")
ANIMATIONS = ("gif", "mp4", "none")
KINDS = {
    "softmax": SoftmaxAttention,
    "l2": L2Attention,
    "sinkhorn": SinkhornAttention,
    "unnormalized": UnnormalizedAttention,
    "linear": LinearAttention,
    "relu": ReLUAttention,
    "sigmoid": SigmoidAttention,
}
BLOCKINGS = ("auto", "dense", "blocked")
CHECKPOINT = "checkpoint.npz"


def _choice(value, key: str, options) -> str:
    if value not in options:
        raise ValueError(
            f"`{key}` must be one of {', '.join(map(str, options))}; "
            f"got {short(value)}."
        )
    return value


def _param(value, key: str, rows: int | None, d: int) -> float | list[list[float]]:
    """A number (times the identity) or a matrix of shape (rows, d) (rows None: any)."""
    if is_number(value):
        if rows is not None and rows != d:
            raise ValueError(f"`{key}` must be a ({rows}, {d}) matrix; got a number.")
        return number(value, key)
    return matrix(value, key, rows, d)


def _resolve_attention(table, d: int) -> dict:
    check_keys(table, DEFAULTS["attention"], "attention")
    att = {**DEFAULTS["attention"], **table}
    out = {"kind": _choice(att["kind"], "attention.kind", KINDS)}
    out["V"] = _param(att["V"], "attention.V", d, d)
    if (att["Q"] is None) != (att["K"] is None):
        raise ValueError("`attention.Q` and `attention.K` must be given together.")
    if att["A"] is not None and att["Q"] is not None:
        raise ValueError("give `attention.A` or `attention.Q`/`attention.K`, not both.")
    if att["Q"] is not None:
        out["Q"] = _param(att["Q"], "attention.Q", None, d)
        rows = len(out["Q"]) if isinstance(out["Q"], list) else d
        out["K"] = _param(att["K"], "attention.K", rows, d)
    elif out["kind"] == "l2" or (
        out["kind"] == "sinkhorn" and att["sinkhorn_kernel"] == "l2"
    ):
        if att["A"] is not None:
            raise ValueError(
                "`attention.A` does not apply to an L2 kernel: give "
                "`attention.Q` and `attention.K`."
            )
        out["Q"] = out["K"] = 1.0
    else:
        out["A"] = 1.0 if att["A"] is None else _param(att["A"], "attention.A", d, d)
    out["sinkhorn_kernel"] = _choice(
        att["sinkhorn_kernel"], "attention.sinkhorn_kernel", ("dot", "l2")
    )
    out["sinkhorn_max_iter"] = integer(
        att["sinkhorn_max_iter"], "attention.sinkhorn_max_iter", 0
    )
    out["blocking"] = _choice(att["blocking"], "attention.blocking", BLOCKINGS)
    return out


def resolve_config(config: dict | None) -> dict:
    """Validate a configuration and fill in the defaults.

    Keys (all optional, defaults in `DEFAULTS`): `n` (>= 2), `d` (>= 1), `t1`
    (> 0), `saves` (>= 2 save times, evenly spaced on [0, t1]), `initial`
    ("sphere" | "gaussian" | "cube"), `scale` (> 0: radius of the sphere, standard
    deviation, half-width), `normalization` ("sphere" | "none"), `masked` (causal
    attention with positions s_i = i/n), `dtype`, `solver`, `rtol`, `atol`, `dt0`,
    `max_steps`, `blowup_radius`, `segments` (checkpoints, >= 1), `cluster_tol`
    (> 0; default automatic), `animation` ("gif" | "mp4" | "none") and an
    `[attention]` table: `kind`, `V`, `A` or `Q`/`K` (a number c for c I, or
    matrices), `sinkhorn_kernel`, `sinkhorn_max_iter`, `blocking`.

    Args:
        config: the user's configuration (e.g. parsed TOML); None for defaults.

    Returns:
        The full configuration (plain lists, numbers and strings).

    Raises:
        ValueError: unknown key, wrong type or bad value; the message (one line)
            names the key.
    """
    config = {} if config is None else config
    check_keys(config, DEFAULTS, None)
    merged = {**DEFAULTS, **config}
    out: dict = {}
    out["n"] = integer(merged["n"], "n", 2)
    d = out["d"] = integer(merged["d"], "d", 1)
    out["t1"] = number(merged["t1"], "t1", positive=True)
    out["saves"] = integer(merged["saves"], "saves", 2)
    out["initial"] = _choice(merged["initial"], "initial", INITIALS)
    out["scale"] = number(merged["scale"], "scale", positive=True)
    out["normalization"] = _choice(
        merged["normalization"], "normalization", NORMALIZATIONS
    )
    if not isinstance(merged["masked"], bool):
        raise ValueError(
            f"`masked` must be true or false; got {short(merged['masked'])}."
        )
    out["masked"] = merged["masked"]
    out["dtype"] = _choice(merged["dtype"], "dtype", DTYPES)
    out["solver"] = _choice(merged["solver"], "solver", SOLVERS)
    out["rtol"] = number(merged["rtol"], "rtol", positive=True)
    out["atol"] = number(merged["atol"], "atol", positive=True)
    dt0 = merged["dt0"]
    out["dt0"] = None if dt0 is None else number(dt0, "dt0", positive=True)
    if out["solver"] == "euler" and out["dt0"] is None:
        raise ValueError('`solver` = "euler" needs a fixed step: set `dt0`.')
    out["max_steps"] = integer(merged["max_steps"], "max_steps", 1)
    out["blowup_radius"] = number(
        merged["blowup_radius"], "blowup_radius", positive=True
    )
    out["segments"] = integer(merged["segments"], "segments", 1)
    if out["segments"] > out["saves"] - 1:
        raise ValueError(
            f"`segments` must be at most `saves` - 1 = {out['saves'] - 1}; "
            f"got {out['segments']}."
        )
    tol = merged["cluster_tol"]
    out["cluster_tol"] = (
        None if tol is None else number(tol, "cluster_tol", positive=True)
    )
    out["animation"] = _choice(merged["animation"], "animation", ANIMATIONS)
    out["attention"] = _resolve_attention(config.get("attention", {}), d)
    if out["attention"]["kind"] == "sinkhorn" and out["masked"]:
        raise ValueError(
            '`attention.kind` = "sinkhorn" cannot be `masked`: the only causal '
            "doubly stochastic kernel is the identity."
        )
    return out


def _as_matrix(value, d: int) -> np.ndarray:
    """A resolved matrix parameter: a list of rows as is, a number c as c I_d."""
    if isinstance(value, list):
        return np.asarray(value, np.float64)
    return value * np.eye(d)


def build_attention(cfg: dict, dtype):
    """The attention module of a resolved configuration."""
    att, d = cfg["attention"], cfg["d"]
    kwargs = {
        name: jnp.asarray(_as_matrix(att[name], d), dtype)
        for name in ("A", "Q", "K")
        if name in att
    }
    if att["kind"] == "sinkhorn":
        kwargs.update(kernel=att["sinkhorn_kernel"], max_iter=att["sinkhorn_max_iter"])
    if att["kind"] in ("softmax", "l2", "sinkhorn"):
        kwargs["blocking"] = att["blocking"]
    V = jnp.asarray(_as_matrix(att["V"], d), dtype)
    return KINDS[att["kind"]](V, **kwargs)


def initial_measure(cfg: dict, seed: int, dtype):
    """Initial tokens (n, d) from the seed; positions s_i = i/n when masked."""
    n, d, scale = cfg["n"], cfg["d"], cfg["scale"]
    key = jr.key(seed)
    if cfg["initial"] == "cube":
        x = jr.uniform(key, (n, d), dtype, -scale, scale)
    else:
        x = jr.normal(key, (n, d), dtype)
        if cfg["initial"] == "sphere":
            x = x / jnp.linalg.norm(x, axis=-1, keepdims=True)
        x = scale * x
    if cfg["masked"]:
        return MaskedParticles(x, jnp.arange(n, dtype=dtype) / n)
    return Particles(x)


def segment_bounds(saves: int, segments: int) -> list[int]:
    """Save-time indices where the segments start and end: [0, ..., saves - 1]."""
    return [round(k * (saves - 1) / segments) for k in range(segments + 1)]


@dataclasses.dataclass(frozen=True)
class _Checkpoint:
    """The state after a number of segments, saved as one `.npz` file.

    Attributes:
        segment: segments done.
        ts: save times reached so far, shape (T',).
        x: states at those times, shape (T', n, d).
        result: status code so far (`_status`).
        blowup_time: +inf unless a segment blew up.
        num_steps: solver steps so far.
        config_json: the configuration and seed (JSON) the run belongs to.
    """

    segment: int
    ts: np.ndarray
    x: np.ndarray
    result: int
    blowup_time: float
    num_steps: int
    config_json: str

    def save(self, path: Path) -> None:
        _io.save_npz_atomic(
            path,
            segment=self.segment,
            ts=self.ts,
            x=self.x,
            result=self.result,
            blowup_time=self.blowup_time,
            num_steps=self.num_steps,
            config_json=np.array(self.config_json),
        )

    @classmethod
    def load(cls, path: Path) -> "_Checkpoint":
        with np.load(path) as data:
            return cls(
                int(data["segment"]),
                data["ts"],
                data["x"],
                int(data["result"]),
                float(data["blowup_time"]),
                int(data["num_steps"]),
                str(data["config_json"]),
            )


def _config_json(cfg: dict, seed: int) -> str:
    return json.dumps({"config": cfg, "seed": seed}, sort_keys=True)


def check_resume(cfg: dict, out: str | Path, seed: int) -> "_Checkpoint | None":
    """The checkpoint in `out` to resume from, None if there is none.

    Raises:
        ValueError: the checkpoint is unreadable or belongs to another
            configuration or seed (one line, for the CLI's exit status 2).
    """
    path = Path(out) / CHECKPOINT
    if not path.exists():
        return None
    try:
        ckpt = _Checkpoint.load(path)
    except (OSError, ValueError, KeyError) as err:
        raise ValueError(f"cannot read checkpoint {str(path)!r}: {err}") from err
    saved = json.loads(ckpt.config_json)
    if saved != json.loads(_config_json(cfg, seed)):
        diff = sorted(
            k
            for k in set(saved["config"]) | set(cfg)
            if saved["config"].get(k) != cfg.get(k)
        )
        what = f"keys {', '.join(diff)}" if diff else f"seed {saved['seed']} != {seed}"
        raise ValueError(
            f"checkpoint {str(path)!r} was written by another run ({what} differ); "
            "use another --out or the same configuration and seed."
        )
    return ckpt


def run_segments(
    cfg: dict,
    out: Path,
    seed: int,
    *,
    resume_from: "_Checkpoint | None" = None,
    progress: bool = True,
) -> Solution:
    """Integrate segment by segment, writing `checkpoint.npz` after each one.

    Args:
        cfg: a resolved configuration.
        out: the output directory (exists).
        seed: PRNG seed of the initial tokens.
        resume_from: a checkpoint of this configuration and seed, or None.
        progress: show a progress bar over the segments.

    Returns:
        The whole run as one `Solution` (save times not reached hold +inf).
    """
    dtype = jnp.dtype(cfg["dtype"])
    attn = build_attention(cfg, dtype)
    measure = initial_measure(cfg, seed, dtype)
    save_ts = np.linspace(0.0, cfg["t1"], cfg["saves"])
    bounds = segment_bounds(cfg["saves"], cfg["segments"])
    normalization = None if cfg["normalization"] == "none" else "sphere"
    options = {
        name: cfg[name]
        for name in ("solver", "rtol", "atol", "dt0", "max_steps", "blowup_radius")
    }
    if normalization == "sphere":
        x0 = measure.x / jnp.linalg.norm(measure.x, axis=-1, keepdims=True)
    else:
        x0 = measure.x
    config_json = _config_json(cfg, seed)
    if resume_from is None:
        ckpt = _Checkpoint(
            0,
            save_ts[:1],
            np.asarray(x0)[None],
            _status.SUCCESS,
            math.inf,
            0,
            config_json,
        )
    else:
        ckpt = resume_from
    bar = tqdm(
        total=cfg["segments"],
        initial=ckpt.segment,
        desc="simulate",
        unit="segment",
        disable=not progress,
        file=sys.stderr,
    )
    with bar:
        while ckpt.segment < cfg["segments"] and _continues(ckpt.result):
            lo, hi = bounds[ckpt.segment], bounds[ckpt.segment + 1]
            start = eqx.tree_at(lambda m: m.x, measure, jnp.asarray(ckpt.x[-1], dtype))
            sol = simulate(
                start,
                attn,
                float(save_ts[hi]),
                t0=float(save_ts[lo]),
                saveat=save_ts[lo + 1 : hi + 1],
                normalization=normalization,
                **options,
            )
            ckpt = _advance(ckpt, sol)
            ckpt.save(out / CHECKPOINT)
            bar.update(1)
    return _solution(ckpt, save_ts, measure)


def _continues(result: int) -> bool:
    # A Sinkhorn tolerance miss is reported but the dynamics go on.
    return result in (_status.SUCCESS, _status.SINKHORN_NOT_CONVERGED)


def _advance(ckpt: "_Checkpoint", sol: Solution) -> "_Checkpoint":
    """The checkpoint after one more segment solved by `sol`."""
    reached = np.isfinite(np.asarray(sol.ts))
    result = int(sol.result)
    worst = ckpt.result if result == _status.SUCCESS else result
    return _Checkpoint(
        ckpt.segment + 1,
        np.concatenate([ckpt.ts, np.asarray(sol.ts)[reached]]),
        np.concatenate([ckpt.x, np.asarray(sol.x)[reached]]),
        worst,
        float(sol.blowup_time),
        ckpt.num_steps + int(sol.num_steps),
        ckpt.config_json,
    )


def _solution(ckpt: "_Checkpoint", save_ts: np.ndarray, measure) -> Solution:
    """Pad the reached rows with +inf to every save time, as `simulate` does."""
    T, reached = len(save_ts), len(ckpt.ts)
    ts = np.full(T, np.inf, ckpt.ts.dtype)
    ts[:reached] = ckpt.ts
    x = np.full((T, *ckpt.x.shape[1:]), np.inf, ckpt.x.dtype)
    x[:reached] = ckpt.x
    t_final = ckpt.blowup_time if math.isfinite(ckpt.blowup_time) else ckpt.ts[-1]
    return Solution(
        ts=jnp.asarray(ts),
        x=jnp.asarray(x),
        blowup_time=jnp.asarray(ckpt.blowup_time),
        result=jnp.asarray(ckpt.result),
        t_final=jnp.asarray(t_final),
        num_steps=jnp.asarray(ckpt.num_steps),
        initial=measure,
    )


def analyse(cfg: dict, sol: Solution) -> tuple[dict, np.ndarray, object]:
    """Clusters of a finished run: (summary, positions clustered (T, n, d), counts).

    On the sphere the tokens themselves are clustered; in R^d the rescaled tokens
    z = e^{-tV} x (Geshkovski et al., 2023), whose limits are the clusters.
    """
    on_sphere = cfg["normalization"] == "sphere"
    d, tol, weights = cfg["d"], cfg["cluster_tol"], sol.initial.weights
    V = _as_matrix(cfg["attention"]["V"], d)
    points = np.asarray(sol.x) if on_sphere else np.asarray(_clustering.rescale(sol, V))
    counts = _clustering.cluster_counts(points, tol, ts=sol.ts)
    reached = np.flatnonzero(np.isfinite(np.asarray(sol.ts)))
    final = points[reached[-1]]
    A = cfg["attention"].get("A")
    # V = I and A positive definite (unmasked softmax in R^d): the limits sit on a
    # convex polytope (Geshkovski et al., 2023).
    on_polytope = (
        not on_sphere
        and not cfg["masked"]
        and cfg["attention"]["kind"] == "softmax"
        and np.array_equal(V, np.eye(d))
        and A is not None
        and d >= 2
        and np.linalg.eigvalsh(_as_matrix(A, d) + _as_matrix(A, d).T)[0] > 0
    )
    poly = _clustering.polytope(final, tol, weights=weights) if on_polytope else None
    if poly is not None:
        found = poly.clusters
    else:
        found = _clustering.detect(final, tol, weights=weights)
    summary = {
        "status": sol.status,
        "t_final": float(sol.t_final),
        "blowup_time": float(sol.blowup_time),
        "blowup_radius": cfg["blowup_radius"],
        "num_steps": int(sol.num_steps),
        "clustered": "x (sphere)" if on_sphere else "z = e^{-tV} x",
        "clusters_final": found.number,
        "cluster_tol": found.tol,
        "cluster_tol_method": found.method,
        "cluster_sizes": sorted(found.sizes.tolist(), reverse=True),
        "radius_final": float(
            np.linalg.norm(np.asarray(sol.x)[reached[-1]], axis=-1).max()
        ),
    }
    if on_sphere:
        tol = _clustering.CONSENSUS_TOL
        summary["one_cluster_time"] = _clustering.consensus_time(sol, tol)
        summary["one_cluster_tol"] = tol
    if poly is not None:
        summary["polytope"] = {
            "vertices": len(poly.vertices),
            "dim": poly.dim,
            "clusters_on_boundary": int(poly.on_boundary.sum()),
            "fraction_at_vertices": poly.fraction_at_vertices,
        }
    return summary, points, counts


def write_figures(cfg: dict, sol: Solution, points, counts, out: Path, progress: bool):
    """trajectories.png, clusters.png, radius.png (R^d) and the animation."""
    d, on_sphere = cfg["d"], cfg["normalization"] == "sphere"
    ts = np.asarray(sol.ts)
    if on_sphere and d == 3:
        fig = plotting.plot_sphere(sol, title=f"t = {float(sol.t_final):.3g}")
    elif d >= 3:
        label = "x(t)" if on_sphere else r"$z(t) = e^{-tV} x(t)$"
        fig = plotting.plot_trajectories_3d(points[:, :, :3], ts, title=label)
    elif d == 2:
        fig = plotting.plot_trajectories(
            sol if on_sphere else eqx.tree_at(lambda s: s.x, sol, jnp.asarray(points)),
            title="x(t)" if on_sphere else "z(t) = exp(-tV) x(t)",
        )
    else:
        fig, ax = plt.subplots(figsize=(6, 4), layout="constrained")
        ax.plot(ts, points[:, :, 0], lw=0.6)
        ax.set_xlabel("t")
        ax.set_ylabel("x" if on_sphere else "z = exp(-tV) x")
    _io.save_figure(fig, out / "trajectories.png", dpi=120)
    what = "x" if on_sphere else "z = exp(-tV) x"
    fig = plotting.plot_cluster_counts(
        counts.ts, counts.counts, tol=counts.tol, title=f"clusters of {what}"
    )
    _io.save_figure(fig, out / "clusters.png", dpi=120)
    if not on_sphere:
        _io.save_figure(plotting.plot_radius(sol), out / "radius.png", dpi=120)
    if cfg["animation"] != "none":
        path = out / f"tokens.{cfg['animation']}"
        if on_sphere:
            plotting.animate(sol, path, progress=progress)
        else:
            plotting.animate(sol, path, x=points, ts=ts, progress=progress)


def run_simulate(
    cfg: dict,
    out_dir: str | Path,
    *,
    seed: int = 0,
    progress: bool = True,
    resume: bool = False,
) -> dict:
    """Run a resolved configuration; write arrays, figures and the manifest.

    Args:
        cfg: output of `resolve_config`.
        out_dir: output directory (created if needed).
        seed: PRNG seed of the initial tokens.
        progress: show progress bars.
        resume: continue from `out_dir/checkpoint.npz` when it exists.

    Returns:
        The summary written into the manifest.

    Raises:
        ValueError: `resume` with a checkpoint of another configuration or seed.
    """
    start = time.perf_counter()
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    if cfg["dtype"] == "float64" and not jax.config.jax_enable_x64:
        jax.config.update("jax_enable_x64", True)
    ckpt = check_resume(cfg, out, seed) if resume else None
    sol = run_segments(cfg, out, seed, resume_from=ckpt, progress=progress)
    summary, points, counts = analyse(cfg, sol)
    summary["resumed_from_segment"] = None if ckpt is None else ckpt.segment
    arrays = {
        "ts": sol.ts,
        "x": sol.x,
        "weights": sol.initial.weights,
        "cluster_ts": counts.ts,
        "cluster_counts": counts.counts,
        "cluster_tol": counts.tol,
    }
    if cfg["normalization"] == "none":
        arrays["z"] = points
    if cfg["masked"]:
        arrays["positions"] = sol.initial.positions
    _io.save_npz_atomic(out / "trajectory.npz", **arrays)
    write_figures(cfg, sol, points, counts, out, progress)
    wall = time.perf_counter() - start
    summary["wall_time_s"] = wall
    manifest = _io.manifest(cfg, seed, wall)
    manifest["summary"] = summary
    _io.write_manifest(out / "manifest.json", manifest)
    summary["out_dir"] = str(out)
    return summary


def format_summary(summary: dict) -> str:
    """The one-screen summary printed by `meanfield simulate`."""
    s = summary
    lines = [
        f"status {s['status']} at t = {s['t_final']:.4g} after {s['num_steps']} steps"
        + (
            f" (resumed from segment {s['resumed_from_segment']})"
            if s["resumed_from_segment"] is not None
            else ""
        ),
        f"{s['clusters_final']} cluster(s) of {s['clustered']} at the end "
        f"(single linkage, tol {s['cluster_tol']:.3g}, {s['cluster_tol_method']}); "
        f"sizes {s['cluster_sizes'][:8]}"
        + (" ..." if len(s["cluster_sizes"]) > 8 else ""),
        f"radius max|x| at the end: {s['radius_final']:.4g}",
    ]
    if math.isfinite(s["blowup_time"]):
        lines.append(
            f"blow-up detected at t* = {s['blowup_time']:.6g} (max|x| reached "
            f"blowup_radius = {s['blowup_radius']:g}, or the velocity outran it)"
        )
    if "one_cluster_time" in s:
        t = s["one_cluster_time"]
        lines.append(
            f"one cluster (diameter <= {s['one_cluster_tol']:g}) from t = {t:.4g}"
            if math.isfinite(t)
            else f"not one cluster (diameter <= {s['one_cluster_tol']:g}) by the end"
        )
    if "polytope" in s:
        p = s["polytope"]
        lines.append(
            f"limit polytope: {p['vertices']} vertices (dim {p['dim']}), "
            f"{p['clusters_on_boundary']} cluster(s) on its boundary, "
            f"{100 * p['fraction_at_vertices']:.0f}% of tokens at vertices"
        )
    return "\n".join(lines)
