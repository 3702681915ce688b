"""Particle dynamics from a configuration, checkpointed (`meanfield simulate`).

Tokens start uniform on the sphere, Gaussian or uniform in a cube; any registered
attention family moves them, on the sphere (the LayerNorm model of Geshkovski,
Letrouit, Polyanskiy & Rigollet, 2023) or in R^d, optionally causal (`masked`)
and with a Brownian forcing (`[noise]`).
The configuration is `simulate_config`; the run, cut into checkpointed segments
(`--resume`), is `simulate_segments`; this module clusters the result, draws the
figures and summarises.

Run it with `meanfield simulate [--config FILE.toml] [--resume]`.
"""

import argparse
import math
import shutil
from pathlib import Path

import equinox as eqx
import jax
import jax.numpy as jnp
import matplotlib.pyplot as plt
import numpy as np

from .. import clustering, plotting
from .._dynamics import Solution
from .._normalization import ON_SPHERE
from .report import Output, Report, Result
from .simulate_config import as_matrix, resolve_config
from .simulate_segments import CHECKPOINT, check_resume, run_segments

#: What each kind of clustered position is called: in the summary, as a
#: coordinate, on a trajectory plot, in the cluster-count title.
_NAMES = {
    "x": dict(summary="x (sphere)", coordinate="x", label="x(t)", what="x"),
    "z": dict(
        summary="z = e^{-tV} x",
        coordinate="z",
        label=r"$z(t) = e^{-tV} x(t)$",
        what="z = exp(-tV) x",
    ),
    "theta": dict(
        summary="θ = x/|x|", coordinate="θ", label="θ(t) = x/|x|", what="θ = x/|x|"
    ),
}


def clustered(cfg: dict) -> str:
    """What a run clusters: "x" (tokens on the sphere), "z" or "theta".

    On the sphere ("sphere", "ngpt") the tokens themselves; in R^d without
    normalisation the rescaled tokens z = e^{-tV} x (Geshkovski et al., 2023), whose
    limits are the clusters; with "pre-ln" / "peri-ln" (a free residual stream) the
    directions theta = x / |x| that the attention sees.
    """
    if cfg["normalization"] in ON_SPHERE:
        return "x"
    return "z" if cfg["normalization"] == "none" else "theta"


def analyse(cfg: dict, sol: Solution) -> tuple[dict, np.ndarray, object]:
    """Clusters of a finished run: (summary, positions clustered (T, n, d), counts)."""
    kind = clustered(cfg)
    on_sphere = kind == "x"
    d, tol, weights = cfg["d"], cfg["cluster_tol"], sol.initial.weights
    V = as_matrix(cfg["attention"]["V"], d)
    x = np.asarray(sol.x)
    if kind == "x":
        points = x
    elif kind == "z":
        points = np.asarray(clustering.rescale(sol, V))
    else:
        with np.errstate(invalid="ignore"):  # +inf rows after an early stop
            points = x / np.linalg.norm(x, axis=-1, keepdims=True)
    counts = clustering.cluster_counts(points, tol, ts=sol.ts)
    reached = np.flatnonzero(np.isfinite(np.asarray(sol.ts)))
    final = points[reached[-1]]
    A = cfg["attention"].get("A")
    # V = I and A positive definite (unmasked softmax in R^d, no feed-forward
    # layer): the limits sit on a convex polytope (Geshkovski et al., 2023).
    on_polytope = (
        kind == "z"
        and not cfg["masked"]
        and cfg.get("feedforward", {}).get("kind", "none") == "none"
        and cfg["attention"]["kind"] == "softmax"
        and np.array_equal(V, np.eye(d))
        and A is not None
        and d >= 2
        and np.linalg.eigvalsh(as_matrix(A, d) + as_matrix(A, d).T)[0] > 0
    )
    poly = clustering.polytope(final, tol, weights=weights) if on_polytope else None
    if poly is not None:
        found = poly.clusters
    else:
        found = clustering.detect(final, tol, weights=weights)
    summary = {
        "status": sol.status,
        "t_final": float(sol.t_final),
        "blowup_time": float(sol.blowup_time),
        "blowup_radius": cfg["blowup_radius"],
        "num_steps": int(sol.num_steps),
        "clustered": _NAMES[kind]["summary"],
        "clusters_final": found.number,
        "cluster_tol": found.tol,
        "cluster_tol_method": found.method,
        "cluster_sizes": sorted(found.sizes.tolist(), reverse=True),
        # At the last *saved* time: a blow-up stops the solve between saves, so
        # this is not the radius at the stop (which reached blowup_radius).
        "radius_final": float(
            np.linalg.norm(np.asarray(sol.x)[reached[-1]], axis=-1).max()
        ),
        "radius_time": float(np.asarray(sol.ts)[reached[-1]]),
    }
    if on_sphere:
        tol = clustering.CONSENSUS_TOL
        summary["one_cluster_time"] = clustering.consensus_time(sol, tol)
        summary["one_cluster_tol"] = tol
    if cfg.get("noise", {"kind": "none"})["kind"] != "none":
        # Noise blurs clusters, so their count at a tolerance is fragile; the
        # order parameter |sum_i w_i p_i / |p_i|| (1 for one cluster) is not.
        order = np.asarray(clustering.order_parameter(points, weights))
        w = np.asarray(weights)
        summary["order_parameter"] = {
            "initial": float(order[0]),
            "final": float(order[reached[-1]]),
            # Its root mean square for independent uniform directions.
            "uniform": float(np.sqrt(np.sum(w**2))),
        }
    if poly is not None:
        summary["polytope"] = {
            "vertices": len(poly.vertices),
            "dim": poly.dim,
            "clusters_on_boundary": int(poly.on_boundary.sum()),
            "fraction_at_vertices": poly.fraction_at_vertices,
        }
    return summary, points, counts


def run_label(cfg: dict) -> str:
    """What ran, for every title: family, causal mask or not, n, where."""
    scheme = cfg["normalization"]
    where = f"S^{cfg['d'] - 1}" if scheme in ON_SPHERE else f"R^{cfg['d']}"
    if scheme not in ("sphere", "none"):
        where += f" ({scheme})"
    mask = ", causal mask" if cfg["masked"] else ""
    noise = cfg.get("noise", {"kind": "none"})
    if noise["kind"] != "none":
        mask += f", {noise['kind']} noise σ = {noise['sigma']:g}"
    field = cfg["attention"]["kind"]
    feedforward = cfg.get("feedforward", {}).get("kind", "none")
    if feedforward != "none":
        field += f" + {feedforward} feed-forward"
    return f"{field}{mask}, n = {cfg['n']} on {where}"


def _figures(cfg: dict, result: Result, output: Output) -> None:
    """trajectories.png, clusters.png, radius.png (R^d) and the animation."""
    sol, points, counts = result.data
    d, kind = cfg["d"], clustered(cfg)
    on_sphere = kind == "x"
    ts = np.asarray(sol.ts)
    run = run_label(cfg)
    coordinate, label = _NAMES[kind]["coordinate"], _NAMES[kind]["label"]
    if on_sphere and d == 3:
        fig = plotting.plot_sphere(sol, title=f"{run}: t = {float(sol.t_final):.3g}")
    elif d >= 3:
        fig = plotting.plot_trajectories_3d(
            points[:, :, :3], ts, title=f"{run}: {label}", coordinate=coordinate
        )
    elif d == 2:
        fig = plotting.plot_trajectories(
            sol if on_sphere else eqx.tree_at(lambda s: s.x, sol, jnp.asarray(points)),
            title=f"{run}: {label}",
            coordinate=coordinate,
        )
    else:
        fig, ax = plt.subplots(figsize=(6, 4), layout="constrained")
        ax.plot(ts, points[:, :, 0], lw=0.6)
        ax.set_xlabel("t")
        ax.set_ylabel(label)
        ax.set_title(run)
    output.figure(fig, "trajectories.png", dpi=120)
    what = _NAMES[kind]["what"]
    fig = plotting.plot_cluster_counts(
        counts.ts,
        counts.counts,
        tol=counts.tol,
        method=counts.method,
        title=f"{run}: clusters of {what}",
    )
    output.figure(fig, "clusters.png", dpi=120)
    if not on_sphere:
        output.figure(plotting.plot_radius(sol, title=run), "radius.png", dpi=120)
    if cfg["animation"] != "none":
        path = output.path(f"tokens.{cfg['animation']}")
        if on_sphere:
            plotting.animate(sol, path, title=run, progress=output.progress)
        else:
            plotting.animate(
                sol, path, x=points, ts=ts, title=run, progress=output.progress
            )


def _compute(
    cfg: dict, output: Output, *, seed: int | None = None, resume: bool = False
) -> Result:
    """Integrate segment by segment (from the checkpoint with `resume`); cluster."""
    seed = 0 if seed is None else seed
    if cfg["dtype"] == "float64" and not jax.config.jax_enable_x64:
        jax.config.update("jax_enable_x64", True)
    ckpt = check_resume(cfg, output.dir, seed) if resume else None
    if resume and ckpt is None:  # said even with --no-progress: not what was asked
        output.note(
            f"--resume: no {CHECKPOINT} in {output.dir}/: starting from the beginning"
        )
    sol = run_segments(
        cfg, output.dir, seed, resume_from=ckpt, progress=output.progress
    )
    summary, points, counts = analyse(cfg, sol)
    summary["resumed_from_segment"] = None if ckpt is None else ckpt.segment
    if cfg["noise"]["kind"] != "none":
        summary["noise"] = {**cfg["noise"], "solver": cfg["solver"]}
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
    return Result(summary, cfg, arrays, (sol, points, counts))


def run_simulate(
    cfg: dict,
    out_dir: str | Path,
    *,
    seed: int = 0,
    progress: bool = True,
    resume: bool = False,
) -> dict:
    """Run a resolved configuration; write arrays, figures and the manifest.

    Writes to `out_dir`: `checkpoint.npz` (after every segment),
    `trajectory.npz` (ts, x, weights, cluster_ts, cluster_counts, cluster_tol; z
    in R^d, positions when masked), trajectories.png, clusters.png, radius.png
    (R^d), tokens.gif / .mp4 and `manifest.json`.

    Args:
        cfg: output of `resolve_config`.
        out_dir: output directory (created if needed).
        seed: PRNG seed of the initial tokens.
        progress: show progress bars.
        resume: continue from `out_dir/checkpoint.npz` when it exists.

    Returns:
        The summary written into the manifest, plus `out_dir`.

    Raises:
        ValueError: `resume` with a checkpoint of another configuration or seed.
    """
    summary = REPORT.run(cfg, out_dir, seed=seed, progress=progress, resume=resume)
    summary["out_dir"] = str(Path(out_dir))
    return summary


def _check(cfg: dict, args: argparse.Namespace) -> None:
    # A checkpoint of another run in --out is a configuration error.
    if args.resume:
        check_resume(cfg, args.out, args.seed)
    # Found now, not after the whole run: an MP4 needs ffmpeg.
    if cfg["animation"] == "mp4" and shutil.which("ffmpeg") is None:
        raise ValueError(
            '`animation = "mp4"` needs ffmpeg, which is not installed; use "gif" '
            'or "none".'
        )


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
    ]
    if "noise" in s:
        noise = s["noise"]
        lines.append(
            f"{noise['kind']} noise, sigma = {noise['sigma']:g}, solver "
            f"{noise['solver']}: Brownian path of seed {noise['seed']} (one key per "
            "segment)"
        )
    if "order_parameter" in s:
        r = s["order_parameter"]
        lines.append(
            f"order parameter (length of the mean direction) of {s['clustered']}: "
            f"{r['initial']:.3f} at t = 0, {r['final']:.3f} at the end (1 for one "
            f"cluster, about {r['uniform']:.3f} for independent uniform directions)"
        )
    if math.isfinite(s["blowup_time"]):
        lines.append(
            f"blow-up detected at t* = {s['blowup_time']:.6g}: max|x| reached "
            f"blowup_radius = {s['blowup_radius']:g}, or the velocity outran it "
            "(e-folding time below the time resolution)"
        )
        lines.append(
            f"radius max|x| at the last save before it, t = {s['radius_time']:.4g}: "
            f"{s['radius_final']:.4g}"
        )
    else:
        lines.append(
            f"radius max|x| at the last save, t = {s['radius_time']:.4g}: "
            f"{s['radius_final']:.4g}"
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


#: `meanfield simulate`.
REPORT = Report(
    "simulate",
    resolve_config,
    _compute,
    _figures,
    format_summary,
    arrays="trajectory.npz",
    check=_check,
    wall_in_summary=True,
    keep=(CHECKPOINT,),
)
