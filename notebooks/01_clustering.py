# ---
# jupyter:
#   jupytext:
#     formats: py:percent
# ---

# %% [markdown]
# # Clustering of tokens under self-attention
#
# Geshkovski, Letrouit, Polyanskiy & Rigollet, "The Emergence of Clusters in
# Self-Attention Dynamics" (NeurIPS 2023): with Q = K = V = I, tokens on the sphere
# (the LayerNorm model) merge into a single cluster, and in ℝᵈ the rescaled tokens
# z = exp(−tV) x converge to points on the boundary of a convex polytope, most of
# them to its vertices. Here clustering is measured with `mf.clustering`, not
# eyeballed.
#
# `SMOKE_TEST=1` runs a small version (used by the test suite).

# %%
import os
import tempfile
from pathlib import Path

import jax
import jax.numpy as jnp
import matplotlib.pyplot as plt
import numpy as np

import meanfield as mf
from meanfield import plotting

SMOKE_TEST = os.environ.get("SMOKE_TEST") == "1"
n, d = (32, 3) if SMOKE_TEST else (256, 3)
t1_sphere, t1_rd = 15.0, 8.0
# Small mode (the test suite) writes to a temporary directory.
OUT = Path(tempfile.mkdtemp()) if SMOKE_TEST else Path("out/notebooks")

# %% [markdown]
# ## On the sphere: one cluster
# Tokens uniform on S², xᵢ′ = (I − xᵢxᵢᵀ) Γ_μ(xᵢ) (`normalization="sphere"`).

# %%
# float32 explicitly: the same tokens whether or not x64 is enabled.
x0 = jax.random.normal(jax.random.key(0), (n, d), dtype=jnp.float32)
x0 = x0 / jnp.linalg.norm(x0, axis=-1, keepdims=True)
attn = mf.SoftmaxAttention(jnp.eye(d), A=jnp.eye(d))
saves = jnp.linspace(0, t1_sphere, 49 if SMOKE_TEST else 121)
sol = mf.simulate(
    mf.Particles(x0), attn, t1_sphere, saveat=saves, normalization="sphere"
)
t_one = mf.clustering.consensus_time(sol, tol=1e-3)
print(sol.status, "| one cluster (diameter <= 1e-3) from t =", t_one)
assert sol.status == "success" and np.isfinite(t_one)

# %% [markdown]
# The number of clusters against t. A fixed tolerance shows the metastable
# clusters merging; the automatic tolerance (`tol=None`) cuts at a tenfold gap of the
# single-linkage merge heights, or at 1e-2 of the scale when there is none
# (`detect(...).method` says which).

# %%
fixed = mf.clustering.cluster_counts(sol, 1e-2)
auto = mf.clustering.cluster_counts(sol)
assert fixed.counts[-1] == 1 and np.all(np.diff(fixed.counts) <= 0)
fig, ax = plt.subplots(figsize=(6, 4), layout="constrained")
plotting.plot_cluster_counts(fixed.ts, fixed.counts, ax=ax, label="tol = 1e-2")
plotting.plot_cluster_counts(auto.ts, auto.counts, ax=ax, label="automatic")
plt.close(fig)
fig = plotting.plot_sphere(sol, time_index=len(saves) // 2)
plt.close(fig)

# %% [markdown]
# ## In ℝᵈ: the rescaled tokens and their polytope
# Without normalisation the tokens grow like eᵗ; z = exp(−tV) x converges. For
# V = I and A positive definite, the limits lie on the boundary of the convex hull
# of the cluster centres.

# %%
sol_rd = mf.simulate(mf.Particles(x0), attn, t1_rd, saveat=jnp.linspace(0, t1_rd, 81))
z = np.asarray(mf.clustering.rescale(sol_rd, jnp.eye(d)))
poly = mf.clustering.polytope(z[-1])
found = poly.clusters
print(
    f"{found.number} clusters of z (tol {found.tol:.3g}, {found.method}); "
    f"{len(poly.vertices)} hull vertices; {int(poly.on_boundary.sum())} clusters on "
    f"the hull; {100 * poly.fraction_at_vertices:.0f}% of tokens at vertices"
)
assert sol_rd.status == "success" and found.number < n
assert poly.on_boundary.all()

# %%
fig = plotting.plot_trajectories_3d(
    z, np.asarray(sol_rd.ts), title="z(t) = e^{-t} x(t)", coordinate="z"
)
ax = fig.axes[0]
vertices = poly.centres[poly.vertices]
ax.scatter(*vertices.T, s=120, marker="*", color="k", label="hull vertices")
plt.close(fig)

# %% [markdown]
# An animation of the sphere run (GIF; `.mp4` when ffmpeg is installed).

# %%
OUT.mkdir(parents=True, exist_ok=True)
path = plotting.animate(sol, OUT / "01_sphere.gif", max_frames=10 if SMOKE_TEST else 60)
print("wrote", path)
