# ---
# jupyter:
#   jupytext:
#     formats: py:percent
# ---

# %% [markdown]
# # Clustering phase diagrams: temperature, attention and where the LayerNorm sits
#
# Geshkovski, Letrouit, Polyanskiy & Rigollet ("A mathematical perspective on
# Transformers", 2023) draw, for n = 32 tokens uniform on the circle with A = βI and
# V = I, the fraction of token pairs that have merged as a function of the temperature
# β and the depth t. At small β everything merges quickly; at large β the tokens first
# form many long-lived (metastable) clusters. The white curve is the time at which n
# equiangular tokens (all pairwise inner products equal) merge: they follow the scalar
# ODE ρ′ = 2(1−ρ)((n−1)ρ+1)/(exp(β(1−ρ)) + n − 1)
# ([equiangular tokens](../math/clusters.md#math-equiangular)).
#
# This notebook draws the diagram with `mf.clustering.phase_diagram`, then compares
# softmax with unnormalised attention (Karagodin, Polyanskiy & Rigollet study both),
# causal masking against none, and the four places of the LayerNorm
# (`normalization=`: post-LN "sphere", "pre-ln", "peri-ln", "ngpt"). `SMOKE_TEST=1`
# runs a small version.

# %%
import os
from pathlib import Path

import jax
import matplotlib.pyplot as plt
import numpy as np

import meanfield as mf

jax.config.update("jax_enable_x64", True)
SMOKE_TEST = os.environ.get("SMOKE_TEST") == "1"
n, d = (8, 2) if SMOKE_TEST else (32, 2)
systems = 8 if SMOKE_TEST else 256
betas = np.linspace(0.5, 9, 3 if SMOKE_TEST else 18)
t1 = 6.0 if SMOKE_TEST else 30.0
saves = np.linspace(0, t1, 7 if SMOKE_TEST else 31)

try:
    ROOT = Path(__file__).resolve().parents[1]
except NameError:  # in Jupyter the working directory is notebooks/
    ROOT = Path.cwd().parent
OUT = ROOT / "out" / "notebooks"


def finish(fig, name):
    """Save the full-size figure (full mode only), then close it."""
    if not SMOKE_TEST:
        OUT.mkdir(parents=True, exist_ok=True)
        fig.savefig(OUT / f"{name}.png", dpi=150)
    plt.close(fig)


def diagram(**options):
    return mf.clustering.phase_diagram(
        betas, n=n, d=d, systems=systems, t1=t1, saveat=saves, **options
    )


# %% [markdown]
# ## Softmax on the sphere, with the equiangular curve

# %%
base = diagram()
fig = mf.plotting.plot_phase_diagram(base)
finish(fig, "07_phase_softmax")
print("one cluster at t1, by beta:", np.round(base.one_cluster[:, -1], 2))

# %% [markdown]
# ## Softmax against unnormalised attention, causal against not
#
# Unnormalised attention weighs each token by exp(β⟨x, y⟩) without dividing by their
# sum: the velocity grows with β and the tokens merge much faster. A cluster then
# contracts at a rate of order exp(β), so an explicit solver needs steps of order
# exp(−β):
# 243 steps to t = 30 at β = 3, 9 883 at β = 7, 62 305 at β = 9 (measured, 16
# systems). Its diagram here stops at β = 4, with fewer systems. The causal mask
# (token i sees tokens j ≤ i) makes every token follow the first one.

# %%
unnormalised = mf.clustering.phase_diagram(
    np.linspace(0.5, 4, 3 if SMOKE_TEST else 15),
    n=n,
    d=d,
    systems=systems if SMOKE_TEST else 64,
    t1=t1,
    saveat=saves,
    attention="unnormalized",
)
variants = {
    "softmax": base,
    "unnormalised (β ≤ 4)": unnormalised,
    "softmax, causal": diagram(masked=True),
}
fig, axes = plt.subplots(1, 3, figsize=(15, 4), layout="constrained")
for ax, (name, result) in zip(axes, variants.items(), strict=True):
    mf.plotting.plot_phase_diagram(result, ax=ax, title=name, theory=name == "softmax")
finish(fig, "07_phase_variants")

# %% [markdown]
# ## Where the LayerNorm sits
#
# Post-LN keeps the tokens on the sphere ("sphere"). Pre-LN normalises only the
# attention's input: the residual stream grows and the angular speed is divided by
# the radius, so the directions merge more slowly. Peri-LN also normalises the output
# (unit speed); nGPT moves on the sphere at speed α = 0.2 towards the normalised
# output. The alignment is measured on the directions θ = x/|x| in every case.

# %%
schemes = ["sphere", "pre-ln", "peri-ln", "ngpt"]
fig, axes = plt.subplots(1, 4, figsize=(20, 4), layout="constrained")
for ax, scheme in zip(axes, schemes, strict=True):
    result = base if scheme == "sphere" else diagram(normalization=scheme)
    mf.plotting.plot_phase_diagram(
        result, ax=ax, title=scheme, theory=scheme == "sphere"
    )
finish(fig, "07_phase_normalisation")
