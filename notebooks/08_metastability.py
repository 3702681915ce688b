# ---
# jupyter:
#   jupytext:
#     formats: py:percent
# ---

# %% [markdown]
# # Long-time clustering: the density on the circle, and the energy staircase
#
# Tokens on the circle under attention with A = βI, V = I gather into clusters
# quickly and then merge on time scales that grow exponentially with β: the
# clustering is metastable (Geshkovski, Koubbi, Polyanskiy & Rigollet, 2024;
# Bruno, Pasqualotto & Agazzi, ICLR 2025).
#
# 1. The mean-field PDE itself, ∂ₜρ + ∂_θ(ρv) = 0, solved for the density ρ on
#    [0, 2π) (`mf.density.simulate`), beside 5000 tokens
#    (`benchmarks/density.py` compares 2·10⁴).
# 2. How many clusters emerge from noise: the fastest-growing Fourier mode of the
#    uniform state, λ_k = k² I_k(β) / (β I₀(β))
#    ([linear growth](../math/density.md#math-density-growth)).
# 3. The energy staircase: `mf.simulate_merging` merges atoms that meet, so a
#    run of 32 tokens to t = 10¹⁴ takes seconds
#    ([merging atoms](../math/energy.md#math-merging)).
#
# `SMOKE_TEST=1` runs a small version.

# %%
import os
from pathlib import Path

import jax
import matplotlib.pyplot as plt
import numpy as np

import meanfield as mf
from meanfield import density

jax.config.update("jax_enable_x64", True)
SMOKE_TEST = os.environ.get("SMOKE_TEST") == "1"

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


# %% [markdown]
# ## 1. The density beside the particles
#
# A smooth initial density, and tokens placed at its quantiles (so the particles
# start within W1 = 2π/(4n) of it, not ~1/√n as a random sample would). The
# same dynamics, once as a PDE on N cells, once as n particles on S¹: W1 on the
# circle measures how far apart they drift.

# %%
beta, t1 = 10.0, 6.0
N = 256 if SMOKE_TEST else 2048
n = 200 if SMOKE_TEST else 5000
ts = np.linspace(0, t1, 13)
theta = density.cell_centres(N)
rho0 = np.exp(2 * np.cos(theta) + 0.5 * np.cos(3 * theta - 1))
rho0 /= rho0.sum() * 2 * np.pi / N
sol = density.simulate(rho0, t1, beta=beta, saveat=ts)
particles = density.simulate_particles(
    density.sample_quantiles(rho0, n), t1, beta=beta, saveat=ts
)
theta_t = density.angles(particles.x)  # (T, n)
w1 = [density.circle_w1(sol.rho[i], theta_t[i]) for i in range(ts.size)]
print(
    f"density: {sol.status}, {sol.num_steps} steps, mass error "
    f"{np.abs(sol.mass - 1).max():.1e}; particles: {particles.status}"
)
print("W1(density, particles):", " ".join(f"{v:.1e}" for v in w1))
fig = mf.plotting.plot_density(sol, particles=particles)
finish(fig, "08_density_particles")

# %% [markdown]
# ## 2. How many clusters emerge from noise
#
# Linearised at the uniform density, the mode exp(ikθ) grows at λ_k. The fastest
# mode k* ≈ √(2β) sets how many clusters form first; the neighbouring modes grow
# almost as fast, so noise decides between k* − 1, k*, k* + 1.

# %%
betas = [5.0, 30.0] if SMOKE_TEST else [5.0, 15.0, 30.0, 60.0]
N = 256 if SMOKE_TEST else 1024
fig, axes = plt.subplots(
    1, len(betas), figsize=(4.5 * len(betas), 3.6), layout="constrained", squeeze=False
)
for ax, b in zip(axes[0], betas, strict=True):
    rng = np.random.default_rng(0)
    rho0 = 1 + 1e-3 * rng.standard_normal(N)
    rho0 /= rho0.sum() * 2 * np.pi / N
    k_star = density.fastest_mode(b)
    # Run until the fastest mode has grown by e^{17}: the clusters have formed.
    t_form = 17 / density.growth_rate(k_star, b)
    noisy = density.simulate(rho0, t_form, beta=b, saveat=[0.0, t_form])
    found = density.count_clusters(noisy.rho[-1])
    ax.plot(noisy.theta, noisy.rho[-1])
    ax.set_title(f"β = {b:g}: {found} clusters, k* = {k_star}")
    ax.set_xlabel("θ")
    print(f"beta = {b:g}: t = {t_form:.1f}, {found} clusters, fastest mode {k_star}")
finish(fig, "08_clusters_from_noise")

# %%
ks = np.arange(1, 25)
fig, ax = plt.subplots(figsize=(6, 4), layout="constrained")
for b in betas:
    ax.plot(ks, density.growth_rate(ks, b), marker=".", label=f"β = {b:g}")
ax.set_xlabel("mode k")
ax.set_ylabel("growth rate λ_k")
ax.legend()
finish(fig, "08_growth_rates")

# %% [markdown]
# ## 3. The energy staircase
#
# The energy E = (1/2β) Σᵢⱼ wᵢwⱼ exp(β⟨xᵢ, xⱼ⟩) never decreases
# ([the energy](../math/energy.md#math-energy-monotone)).
# It climbs one step per merge of two clusters and stays flat on the metastable
# plateaus in between, which last exponentially long in β. `simulate_merging`
# replaces atoms that meet by one atom of their summed weight, so the run never
# has to resolve a collapsed cluster.

# %%
beta = 9.0 if SMOKE_TEST else 16.0
t_end = 1e8 if SMOKE_TEST else 1e14
theta0 = np.random.default_rng(0).uniform(0, 2 * np.pi, 32)
ts = np.concatenate([[0.0], np.logspace(-2, np.log10(t_end), 161)])
run = mf.simulate_merging(
    mf.Particles(np.stack([np.cos(theta0), np.sin(theta0)], 1)),
    mf.SoftmaxAttention(np.eye(2), A=beta * np.eye(2)),
    t_end,
    merge_tol=1e-4,
    saveat=ts,
    normalization="sphere",
)
print(f"{run.status}: {run.num_steps} steps; atoms at the end: {run.counts[-1]}")
fig = mf.plotting.plot_energy(
    run.ts,
    log_energy=run.log_energy,
    beta=run.beta,
    counts=run.counts,
    title=f"n = 32 tokens, β = {beta:g}",
)
finish(fig, "08_energy_staircase")
