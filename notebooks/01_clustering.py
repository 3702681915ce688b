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
# (the LayerNorm model) merge into a single cluster, and in R^d the rescaled tokens
# z = e^{-tV} x converge to the vertices of a convex polytope.
#
# `SMOKE_TEST=1` runs a small version (used by the test suite).

# %%
import os

import jax
import jax.numpy as jnp
import matplotlib.pyplot as plt
import numpy as np

import meanfield as mf
from meanfield import plotting

SMOKE_TEST = os.environ.get("SMOKE_TEST") == "1"
n, d = (32, 3) if SMOKE_TEST else (256, 3)
t1 = 8.0 if SMOKE_TEST else 15.0

# %%
x0 = jax.random.normal(jax.random.key(0), (n, d))
x0 = x0 / jnp.linalg.norm(x0, axis=-1, keepdims=True)
attn = mf.SoftmaxAttention(jnp.eye(d), A=jnp.eye(d))
sol = mf.simulate(
    mf.Particles(x0), attn, t1, saveat=jnp.linspace(0, t1, 81), normalization="sphere"
)
diameter = float(
    jnp.max(jnp.linalg.norm(sol.x[-1][:, None] - sol.x[-1][None], axis=-1))
)
print(sol.status, "final diameter", diameter)
assert sol.status == "success" and diameter < 0.5

# %%
fig = plotting.plot_sphere(sol)
plt.close(fig)

# %% [markdown]
# In R^d (no normalisation) the tokens grow like e^{t}; rescaling by e^{-tV} shows
# the clusters.

# %%
sol_rd = mf.simulate(mf.Particles(x0), attn, 5.0, saveat=jnp.linspace(0, 5, 51))
z = np.exp(-np.asarray(sol_rd.ts))[:, None, None] * np.asarray(sol_rd.x)
print("rescaled radius at t = 5:", np.linalg.norm(z[-1], axis=-1).max())
fig = plotting.plot_trajectories_3d(z, np.asarray(sol_rd.ts))
plt.close(fig)
