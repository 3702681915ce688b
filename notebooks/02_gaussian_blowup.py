# ---
# jupyter:
#   jupytext:
#     formats: py:percent
# ---

# %% [markdown]
# # Blow-up of attention variants on Gaussians
#
# Castin, Ablin, Carrillo & Peyre, "A Unified Perspective on the Dynamics of Deep
# Transformers" (2025): a Gaussian stays Gaussian under softmax, L2 and Sinkhorn
# attention; softmax can blow up in finite time, L2 with a full-rank K and Sinkhorn
# cannot. `SMOKE_TEST=1` runs a small version.

# %%
import os

import jax
import jax.numpy as jnp
import matplotlib.pyplot as plt
import numpy as np

import meanfield as mf
from meanfield import plotting

jax.config.update("jax_enable_x64", True)
SMOKE_TEST = os.environ.get("SMOKE_TEST") == "1"
batch = 64 if SMOKE_TEST else 10_000

# %%
gauss = mf.Gaussian(jnp.array([0.5, 0.0]), jnp.array([[1.0, 0.3], [0.3, 0.5]]))
Q, K, V = jnp.array([[1.0, 0.5], [0.0, 1.0]]), jnp.eye(2), jnp.eye(2)
variants = {
    "softmax": mf.SoftmaxAttention(V, Q=Q, K=K),
    "L2": mf.L2Attention(V, Q=Q, K=K),
    "Sinkhorn": mf.SinkhornAttention(V, Q=Q, K=K),
}
solutions = {
    name: mf.gaussian.simulate(gauss, attn, 3.0, saveat=jnp.linspace(0, 3, 121))
    for name, attn in variants.items()
}
for name, sol in solutions.items():
    print(f"{name:9s} {sol.status:8s} blow-up time {float(sol.blowup_time):.6f}")
print("closed form t* (softmax):", mf.gaussian.blowup_time(gauss, variants["softmax"]))

# %%
plt.close(plotting.plot_covariance_ellipses(solutions))
plt.close(plotting.plot_covariance_eigenvalues(solutions))

# %% [markdown]
# A batch of random interaction matrices: which fraction blows up before t = 5?

# %%
As = jax.random.normal(jax.random.key(1), (batch, 2, 2)) / np.sqrt(2)
make = lambda cls: jax.vmap(lambda A: cls(V, A=A))(As)
study = mf.gaussian.blowup_times(
    gauss,
    {"softmax": make(mf.SoftmaxAttention), "Sinkhorn": make(mf.SinkhornAttention)},
    5.0,
)
print(study.fraction)
assert study.fraction["Sinkhorn"] == 0.0
