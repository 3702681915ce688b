"""The tour of meanfield (`meanfield demo`, `make demo`): four headline results.

1. Clustering (`run_clustering`). Geshkovski, Letrouit, Polyanskiy & Rigollet,
   "The Emergence of Clusters in Self-Attention Dynamics" (NeurIPS 2023) and "A
   mathematical perspective on Transformers" (2023): tokens drawn uniformly on
   the sphere, Q = K = V = I. (a) On the sphere (LayerNorm model) the tokens
   collapse into a few clusters, then one. (b) In R^d (no normalisation) they
   grow like e^t; the rescaled tokens z_i(t) = e^{-tV} x_i(t) converge to a few
   points (the vertices of a convex polytope when V = I).
2. Blow-up of attention variants on a Gaussian (`meanfield gaussian`, Castin,
   Ablin, Carrillo & Peyre, 2025): softmax blows up in finite time, L2 and
   Sinkhorn do not.
3. How smooth attention is (`meanfield lipschitz`, Castin, Ablin & Peyre, ICML
   2024): the local Lipschitz constant grows like sqrt(n) at adversarial inputs.
4. The clustering phase diagram over the temperature (`meanfield phase`,
   Geshkovski et al., 2023) on a reduced grid: merged token pairs over (beta, t)
   beside the equiangular prediction.

Run it with `meanfield demo` or `python -m meanfield demo`.
"""

from pathlib import Path

import jax.numpy as jnp
import jax.random as jr
import matplotlib.pyplot as plt
import numpy as np

from .. import clustering, plotting
from .._attention.softmax import SoftmaxAttention
from .._dynamics import simulate
from .._measures import Particles
from . import gaussian_report as _gaussian_report
from . import lipschitz_report as _lipschitz_report
from . import phase_report as _phase_report
from .report import Output

#: Save times per run (including both ends).
NUM_SAVES = 121


def _last_reached(ts, x) -> np.ndarray:
    """State at the last reached save time, shape (n, d)."""
    ts = np.asarray(ts)
    return np.asarray(x)[np.flatnonzero(np.isfinite(ts))[-1]]


def _sphere_snapshots(sol, clusters_final: int):
    """Tokens on S^2 at a few times (ending at the final one): clusters forming.

    With Q = K = V = I and d = 3 all tokens end in one cluster (Geshkovski et al.,
    2023); the intermediate panels show the collapse towards it. At this
    temperature (beta = 1) no long-lived intermediate clusters form: metastable
    multi-cluster states need a larger beta.
    """
    ts = np.asarray(sol.ts)
    ts = ts[np.isfinite(ts)]
    t_last = float(ts[-1])
    # Fractions of the horizon chosen for the default t1 = 15: uniform, then
    # three stages of the collapse, final.
    targets = [0.0, 5.0 / 15, 6.0 / 15, 7.0 / 15, 1.0]
    idx = sorted({int(np.abs(ts - f * t_last).argmin()) for f in targets})
    fig = plt.figure(figsize=(3.0 * len(idx), 3.6), layout="constrained")
    x_final = _last_reached(sol.ts, sol.x)
    center = x_final.mean(axis=0)
    # One view for every panel: facing where the tokens end up.
    elev = np.degrees(np.arcsin(np.clip(center[2] / np.linalg.norm(center), -1, 1)))
    azim = np.degrees(np.arctan2(center[1], center[0]))
    for p, i in enumerate(idx):
        ax = fig.add_subplot(1, len(idx), p + 1, projection="3d")
        ax.view_init(elev=elev, azim=azim)
        last = i == idx[-1]
        title = f"t = {ts[i]:.3g}" + (f": {clusters_final} cluster(s)" if last else "")
        plotting.plot_sphere(sol, time_index=i, ax=ax, title=title)
    n, d = sol.x.shape[1:]
    fig.suptitle(f"{n} tokens on the sphere S^{d - 1}, Q = K = V = I")
    return fig


def run_clustering(
    out_dir: str | Path = "out/clustering",
    *,
    n: int = 256,
    d: int = 3,
    t1_sphere: float = 15.0,
    t1_rd: float = 8.0,
    seed: int = 0,
    progress: bool = True,
    max_frames: int = 60,
) -> dict:
    """Cluster n tokens under softmax self-attention with Q = K = V = I.

    Writes to `out_dir` (created if needed): `sphere.png` (the tokens on the
    sphere at five times), `sphere_trajectories.png` (planar projections of the
    sphere run),
    `rescaled.png` (rescaled trajectories e^{-t} x(t) of the R^d run),
    `clusters.png` (number of clusters against t, automatic tolerance),
    `tokens.gif` (animation of the sphere run),
    `trajectory.npz` (ts_sphere, x_sphere, ts_rd, x_rd, z_rd, weights) and
    `manifest.json` (configuration, seed, versions, device, wall time, summary).

    Args:
        out_dir: output directory.
        n: number of tokens.
        d: dimension (figures on the sphere need d = 3; other d still run, and
            plot projections of the first three coordinates).
        t1_sphere: final time of the run on the sphere.
        t1_rd: final time of the run in R^d.
        seed: PRNG seed of the initial tokens.
        progress: show progress bars.
        max_frames: frames of the animation.

    Returns:
        The summary: statuses, step counts, max | |x_i| - 1 | on the sphere run,
        diameter, number of clusters and one-cluster time of the sphere run, and
        the number of clusters of the rescaled R^d tokens at their final time
        with their place on the hull of the cluster centres.

    Raises:
        ValueError: n < 2, d < 2, or non-positive final times.
    """
    if n < 2 or d < 2:
        raise ValueError(f"`n` and `d` must be >= 2; got n={n}, d={d}.")
    if not (t1_sphere > 0 and t1_rd > 0):
        raise ValueError(
            f"`t1_sphere` and `t1_rd` must be positive; got {t1_sphere}, {t1_rd}."
        )
    output = Output(out_dir, progress=progress)
    with output.locked():
        output.clear_previous()
        return _clustering(output, n, d, t1_sphere, t1_rd, seed, progress, max_frames)


def _clustering(output, n, d, t1_sphere, t1_rd, seed, progress, max_frames) -> dict:
    """The two runs of `run_clustering` into the locked `output`."""
    out = output.dir

    # Uniform on S^{d-1}: normalised standard Gaussians. float32 is explicit so the
    # run is the same whether or not the caller enabled x64.
    g = jr.normal(jr.key(seed), (n, d), dtype=jnp.float32)
    mu = Particles(g / jnp.linalg.norm(g, axis=-1, keepdims=True))
    eye = jnp.eye(d, dtype=jnp.float32)
    attn = SoftmaxAttention(eye, A=eye)  # Q = K = V = I

    sol_s = simulate(
        mu,
        attn,
        t1_sphere,
        saveat=jnp.linspace(0, t1_sphere, NUM_SAVES),
        normalization="sphere",
        progress=progress,
    )
    sol_r = simulate(
        mu,
        attn,
        t1_rd,
        saveat=jnp.linspace(0, t1_rd, NUM_SAVES),
        normalization=None,
        progress=progress,
    )
    z_r = np.asarray(clustering.rescale(sol_r, eye))

    ts_s, x_s = np.asarray(sol_s.ts), np.asarray(sol_s.x)
    reached_s = np.isfinite(ts_s)
    x_final = _last_reached(ts_s, x_s)
    z_final = _last_reached(sol_r.ts, z_r)
    # Automatic (gap) tolerances: the clusters are read off the data's own scale.
    clusters_s = clustering.detect(x_final)
    polytope = clustering.polytope(z_final)
    clusters_r = polytope.clusters
    counts_s = clustering.cluster_counts(sol_s)
    counts_r = clustering.cluster_counts(z_r, ts=sol_r.ts)
    summary = {
        "sphere": {
            "status": sol_s.status,
            "num_steps": int(sol_s.num_steps),
            "t_final": float(sol_s.t_final),
            "max_norm_deviation": float(
                np.abs(np.linalg.norm(x_s[reached_s], axis=-1) - 1).max()
            ),
            "diameter_final": clustering.diameter(x_final),
            "clusters_final": clusters_s.number,
            "cluster_tol": clusters_s.tol,
            "one_cluster_time": clustering.consensus_time(sol_s),
        },
        "rd": {
            "status": sol_r.status,
            "num_steps": int(sol_r.num_steps),
            "t_final": float(sol_r.t_final),
            "blowup_time": float(sol_r.blowup_time),
            "radius_final": float(
                np.linalg.norm(_last_reached(sol_r.ts, sol_r.x), axis=-1).max()
            ),
            "clusters_rescaled_final": clusters_r.number,
            "cluster_tol": clusters_r.tol,
            "polytope_vertices": len(polytope.vertices),
            "clusters_on_hull": int(polytope.on_boundary.sum()),
            "fraction_at_vertices": polytope.fraction_at_vertices,
        },
    }

    output.arrays(
        "trajectory.npz",
        ts_sphere=sol_s.ts,
        x_sphere=sol_s.x,
        ts_rd=sol_r.ts,
        x_rd=sol_r.x,
        z_rd=z_r,
        weights=mu.weights,
    )
    if d == 3:
        output.figure(
            _sphere_snapshots(sol_s, summary["sphere"]["clusters_final"]),
            "sphere.png",
        )
    fig, axes = plt.subplots(1, 3, figsize=(13.5, 4.8), layout="constrained")
    for ax, dims in zip(axes, [(0, 1), (0, 2), (1, 2)], strict=True):
        if max(dims) < d:
            plotting.plot_trajectories(sol_s, ax=ax, dims=dims, title=f"dims {dims}")
        else:
            ax.set_axis_off()
    fig.suptitle(f"trajectories on the sphere S^{d - 1}, n = {n}")
    output.figure(fig, "sphere_trajectories.png")
    if d >= 3:
        output.figure(
            plotting.plot_trajectories_3d(
                np.asarray(z_r)[:, :, :3],
                sol_r.ts,
                title=r"rescaled tokens $z(t) = e^{-t} x(t)$ in $\mathbb{R}^d$",
                coordinate="z",
            ),
            "rescaled.png",
        )

    fig, ax = plt.subplots(figsize=(6.0, 4.0), layout="constrained")
    plotting.plot_cluster_counts(
        counts_s.ts, counts_s.counts, ax=ax, label="on the sphere: x(t)"
    )
    plotting.plot_cluster_counts(
        counts_r.ts, counts_r.counts, ax=ax, label=r"in $R^d$: $e^{-t} x(t)$"
    )
    ax.set_title(
        f"clusters against t (single linkage, automatic tolerance), n = {n}",
        fontsize="medium",
    )
    output.figure(fig, "clusters.png")
    plotting.animate(
        sol_s, out / "tokens.gif", max_frames=max_frames, progress=progress
    )

    config = {
        "out_dir": str(out),
        "n": n,
        "d": d,
        "t1_sphere": t1_sphere,
        "t1_rd": t1_rd,
        "seed": seed,
        "dtype": "float32",
        "initial": "uniform on the unit sphere (normalised Gaussians)",
        "attention": "SoftmaxAttention(V=I, A=I)  (Q = K = V = I)",
        "solver": "tsit5",
        "rtol": 1e-6,
        "atol": 1e-6,
        "num_saves": NUM_SAVES,
        "cluster_tol": "automatic (gap rule of mf.clustering.detect)",
    }
    wall = output.manifest(config, seed, summary)["wall_time_s"]

    s, r = summary["sphere"], summary["rd"]
    print(
        f"sphere  (t1={t1_sphere:g}): {s['status']}, {s['num_steps']} steps, "
        f"{s['clusters_final']} cluster(s), diameter {s['diameter_final']:.3g}, "
        f"one cluster from t = {s['one_cluster_time']:.3g}, "
        f"max||x|-1| {s['max_norm_deviation']:.2g}\n"
        f"R^{d} (t1={t1_rd:g}): {r['status']}, {r['num_steps']} steps, "
        f"radius {r['radius_final']:.3g}, "
        f"{r['clusters_rescaled_final']} cluster(s) of e^(-t) x, "
        f"{r['clusters_on_hull']} on the hull of their centres "
        f"({r['polytope_vertices']} vertices)\n"
        f"wrote {out}/ in {wall:.1f} s"
    )
    return summary


#: Reduced sizes of the Gaussian and Lipschitz parts for `quick` tours (tests).
_QUICK = {
    "gaussian": {"phase": {"s_range": [-1.5, 1.5, 5], "r_range": [-1.5, 1.5, 5]}},
    "lipschitz": {"ns": [16, 64], "search": {"max_n": 0}},
    "phase": {"betas": [1.0, 9.0, 3], "systems": 8, "t1": 10.0, "saves": 6},
}
#: The tour's phase diagram: the published grid (n = 32 on S^1, t <= 30) with
#: 24 betas and 128 systems per beta instead of 90 and 2048.
_TOUR_PHASE = {"betas": [0.25, 9.0, 24], "systems": 128}
#: The tour's Lipschitz study: the default sizes without the largest, with a
#: short search (keeps `make demo` under three minutes on 2 cores).
_TOUR_LIPSCHITZ = {
    "ns": [16, 32, 64, 128, 256, 512, 1024],
    "search": {"max_n": 32, "restarts": 1, "steps": 200},
}


def run_demo(
    out_dir: str | Path = "out",
    *,
    n: int = 256,
    seed: int = 0,
    progress: bool = True,
    quick: bool = False,
) -> dict:
    """The tour: clustering, Gaussian blow-up, Lipschitz scaling, phase diagram.

    Writes `clustering/` (`run_clustering`: tokens.gif, sphere.png, clusters.png,
    ...), `gaussian/` (`meanfield gaussian` defaults: ellipses.png,
    eigenvalues.png, phase.png) and `lipschitz/` (`meanfield lipschitz` on
    n = 16..1024: lipschitz.png) and `phase/` (`meanfield phase` on a reduced
    grid: phase.png) under `out_dir`, a `manifest.json` with the four summaries,
    and prints them.

    Args:
        out_dir: output directory.
        n: number of tokens of the clustering runs.
        seed: PRNG seed (initial tokens, random Lipschitz inputs).
        progress: show progress.
        quick: much smaller Gaussian phase diagram, Lipschitz sizes and
            clustering phase diagram (tests).

    Returns:
        {"clustering": ..., "gaussian": ..., "lipschitz": ..., "phase": ...}
        summaries.
    """
    output = Output(out_dir, progress=progress)
    with output.locked():  # two tours never write into one directory
        output.clear_previous()
        return _tour(output, n=n, seed=seed, progress=progress, quick=quick)


def _tour(output: Output, *, n: int, seed: int, progress: bool, quick: bool) -> dict:
    """The four parts of `run_demo` into the locked `output`."""
    out = output.dir
    summary = {}
    print("1/4  clustering of tokens, Q = K = V = I (Geshkovski et al., 2023)")
    summary["clustering"] = run_clustering(
        out / "clustering",
        n=n,
        seed=seed,
        progress=progress,
        max_frames=12 if quick else 60,
    )
    print("\n2/4  Gaussian blow-up: softmax vs L2 vs Sinkhorn (Castin et al., 2025)")
    gaussian_cfg = _gaussian_report.resolve_config(
        _QUICK["gaussian"] if quick else None
    )
    summary["gaussian"] = _gaussian_report.run_gaussian(
        gaussian_cfg, out / "gaussian", seed=seed, progress=progress
    )
    print(_gaussian_report.format_summary(summary["gaussian"]))
    print("\n3/4  Lipschitz constant against n (Castin, Ablin & Peyre, 2024)")
    lipschitz_cfg = _lipschitz_report.resolve_config(
        _QUICK["lipschitz"] if quick else _TOUR_LIPSCHITZ
    )
    summary["lipschitz"] = _lipschitz_report.run_lipschitz(
        lipschitz_cfg, out / "lipschitz", seed=seed, progress=progress
    )
    print(_lipschitz_report.format_summary(summary["lipschitz"]))
    print("\n4/4  clustering phase diagram over beta (Geshkovski et al., 2023)")
    phase_cfg = _phase_report.resolve_config(_QUICK["phase"] if quick else _TOUR_PHASE)
    summary["phase"] = _phase_report.run_phase(
        phase_cfg, out / "phase", seed=seed, progress=progress
    )
    print(_phase_report.format_summary(summary["phase"]))
    config = {
        "n": n,
        "quick": quick,
        "gaussian": gaussian_cfg,
        "lipschitz": lipschitz_cfg,
        "phase": phase_cfg,
    }
    wall = output.manifest(config, seed, summary)["wall_time_s"]
    print(
        f"\ntour done in {wall:.0f} s: {out}/clustering/tokens.gif, "
        f"{out}/gaussian/ellipses.png, {out}/lipschitz/lipschitz.png, "
        f"{out}/phase/phase.png"
    )
    return summary
