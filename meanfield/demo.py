"""The canonical clustering run of self-attention dynamics, with figures.

Geshkovski, Letrouit, Polyanskiy & Rigollet, "The Emergence of Clusters in
Self-Attention Dynamics" (NeurIPS 2023) and "A mathematical perspective on
Transformers" (2023): tokens drawn uniformly on the sphere, Q = K = V = I.

(a) On the sphere (LayerNorm model) the tokens collapse into a few clusters.
(b) In R^d (no normalisation) they grow like e^t; the rescaled tokens
    z_i(t) = e^{-tV} x_i(t) converge to a few points (the vertices of a convex
    polytope when V = I).

Run it with `meanfield demo` or `python -m meanfield demo`.
"""

import time
from pathlib import Path

import jax
import jax.numpy as jnp
import jax.random as jr
import jax.scipy.linalg as jsl
import matplotlib.pyplot as plt
import numpy as np
from jaxtyping import Array, ArrayLike, Float

from . import _io, plotting
from ._attention.softmax import SoftmaxAttention
from ._dynamics import simulate
from ._measures import Particles

#: Distance under which two tokens count as one cluster.
CLUSTER_TOL = 1e-2
#: Save times per run (including both ends).
NUM_SAVES = 121


def rescale(
    ts: Float[ArrayLike, " T"], x: Float[ArrayLike, "T n d"], V: Float[ArrayLike, "d d"]
) -> Float[Array, "T n d"]:
    """Rescaled trajectories z(t) = e^{-tV} x(t) (Geshkovski et al., 2023, Sec. 3).

    For x' = V x + (attention-weighted mean), e^{-tV} removes the linear growth;
    with V = I this is z(t) = e^{-t} x(t). The matrix exponential is computed per
    time, so any V works.

    Args:
        ts: times, shape (T,); non-finite entries (not reached) give +inf rows.
        x: trajectories, shape (T, n, d).
        V: value matrix, shape (d, d).

    Returns:
        z, shape (T, n, d).
    """
    ts, x = jnp.asarray(ts), jnp.asarray(x)
    V = jnp.asarray(V, x.dtype)
    reached = jnp.isfinite(ts)
    # expm(-inf V) is NaN: evaluate at t = 0 and mark the row afterwards.
    t_safe = jnp.where(reached, ts, 0).astype(x.dtype)
    propagators = jax.vmap(lambda t: jsl.expm(-t * V))(t_safe)  # (T, d, d)
    z = jnp.einsum("tij,tnj->tni", propagators, x)
    return jnp.where(reached[:, None, None], z, jnp.inf)


def count_clusters(x: Float[ArrayLike, "n d"], tol: float = CLUSTER_TOL) -> int:
    """Number of clusters: points closer than `tol` are merged (transitively).

    Single-linkage components of the graph |x_i - x_j| < tol, by union-find on
    the (n, n) distance matrix (n is small here).

    Args:
        x: points, shape (n, d).
        tol: merging distance.

    Returns:
        The number of clusters.
    """
    x = np.asarray(x, dtype=np.float64)
    n = x.shape[0]
    dist = np.linalg.norm(x[:, None, :] - x[None, :, :], axis=-1)
    parent = np.arange(n)

    def find(i):
        while parent[i] != i:
            parent[i] = parent[parent[i]]  # path halving
            i = parent[i]
        return i

    for i, j in zip(*np.nonzero(np.triu(dist < tol, k=1)), strict=True):
        ri, rj = find(i), find(j)
        if ri != rj:
            parent[ri] = rj
    return len({find(i) for i in range(n)})


def _last_reached(ts, x) -> np.ndarray:
    """State at the last reached save time, shape (n, d)."""
    ts = np.asarray(ts)
    return np.asarray(x)[np.flatnonzero(np.isfinite(ts))[-1]]


def _diameter(x: np.ndarray) -> float:
    return float(np.linalg.norm(x[:, None, :] - x[None, :, :], axis=-1).max())


def _sphere_snapshots(sol, clusters_final: int):
    """Tokens on S^2 at a few times (ending at the final one): clusters forming.

    With Q = K = V = I and d = 3 all tokens end in one cluster (Geshkovski et al.,
    2023); the intermediate panels show the metastable clusters on the way.
    """
    ts = np.asarray(sol.ts)
    ts = ts[np.isfinite(ts)]
    t_last = float(ts[-1])
    # Fractions of the horizon chosen for the default t1 = 15: uniform, first
    # clusters, several clusters, a few clusters, final.
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


def _save(fig, path: Path) -> None:
    try:
        _io.savefig_atomic(fig, path, dpi=150)
    finally:
        plt.close(fig)  # pyplot keeps every open figure alive otherwise


def run_demo(
    out_dir: str = "out",
    *,
    n: int = 256,
    d: int = 3,
    t1_sphere: float = 15.0,
    t1_rd: float = 8.0,
    seed: int = 0,
    progress: bool = True,
) -> dict:
    """Cluster n tokens under softmax self-attention with Q = K = V = I.

    Writes to `out_dir` (created if needed): `sphere.png` (final state on the
    sphere), `sphere_trajectories.png` (planar projections of the sphere run),
    `rescaled.png` (rescaled trajectories e^{-t} x(t) of the R^d run),
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

    Returns:
        The summary: statuses, step counts, max | |x_i| - 1 | on the sphere run,
        diameter and number of clusters at the final sphere time, and the number
        of clusters of the rescaled R^d tokens at their final time.

    Raises:
        ValueError: n < 2, d < 2, or non-positive final times.
    """
    if n < 2 or d < 2:
        raise ValueError(f"`n` and `d` must be >= 2; got n={n}, d={d}.")
    if not (t1_sphere > 0 and t1_rd > 0):
        raise ValueError(
            f"`t1_sphere` and `t1_rd` must be positive; got {t1_sphere}, {t1_rd}."
        )
    start = time.perf_counter()
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)

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
    z_r = rescale(sol_r.ts, sol_r.x, eye)

    ts_s, x_s = np.asarray(sol_s.ts), np.asarray(sol_s.x)
    reached_s = np.isfinite(ts_s)
    x_final = _last_reached(ts_s, x_s)
    z_final = _last_reached(sol_r.ts, z_r)
    summary = {
        "sphere": {
            "status": sol_s.status,
            "num_steps": int(sol_s.num_steps),
            "t_final": float(sol_s.t_final),
            "max_norm_deviation": float(
                np.abs(np.linalg.norm(x_s[reached_s], axis=-1) - 1).max()
            ),
            "diameter_final": _diameter(x_final),
            "clusters_final": count_clusters(x_final, CLUSTER_TOL),
        },
        "rd": {
            "status": sol_r.status,
            "num_steps": int(sol_r.num_steps),
            "t_final": float(sol_r.t_final),
            "blowup_time": float(sol_r.blowup_time),
            "radius_final": float(
                np.linalg.norm(_last_reached(sol_r.ts, sol_r.x), axis=-1).max()
            ),
            "clusters_rescaled_final": count_clusters(z_final, CLUSTER_TOL),
        },
        "cluster_tol": CLUSTER_TOL,
    }

    _io.save_npz_atomic(
        out / "trajectory.npz",
        ts_sphere=sol_s.ts,
        x_sphere=sol_s.x,
        ts_rd=sol_r.ts,
        x_rd=sol_r.x,
        z_rd=z_r,
        weights=mu.weights,
    )
    if d == 3:
        _save(
            _sphere_snapshots(sol_s, summary["sphere"]["clusters_final"]),
            out / "sphere.png",
        )
    fig, axes = plt.subplots(1, 3, figsize=(13.5, 4.8), layout="constrained")
    for ax, dims in zip(axes, [(0, 1), (0, 2), (1, 2)], strict=True):
        if max(dims) < d:
            plotting.plot_trajectories(sol_s, ax=ax, dims=dims, title=f"dims {dims}")
        else:
            ax.set_axis_off()
    fig.suptitle(f"trajectories on the sphere S^{d - 1}, n = {n}")
    _save(fig, out / "sphere_trajectories.png")
    if d >= 3:
        _save(
            plotting.plot_trajectories_3d(
                np.asarray(z_r)[:, :, :3],
                sol_r.ts,
                title=r"rescaled tokens $z(t) = e^{-t} x(t)$ in $\mathbb{R}^d$",
            ),
            out / "rescaled.png",
        )

    wall = time.perf_counter() - start
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
        "cluster_tol": CLUSTER_TOL,
    }
    man = _io.manifest(config, seed, wall)
    man["summary"] = summary
    _io.write_manifest(out / "manifest.json", man)

    s, r = summary["sphere"], summary["rd"]
    print(
        f"sphere  (t1={t1_sphere:g}): {s['status']}, {s['num_steps']} steps, "
        f"{s['clusters_final']} cluster(s), diameter {s['diameter_final']:.3g}, "
        f"max||x|-1| {s['max_norm_deviation']:.2g}\n"
        f"R^{d} (t1={t1_rd:g}): {r['status']}, {r['num_steps']} steps, "
        f"radius {r['radius_final']:.3g}, "
        f"{r['clusters_rescaled_final']} cluster(s) of e^(-t) x\n"
        f"wrote {out}/ in {wall:.1f} s"
    )
    return summary
