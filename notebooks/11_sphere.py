# ---
# jupyter:
#   jupytext:
#     formats: py:percent
# ---

# %% [markdown]
# # The density on the sphere: S², S³ and the linear theory in any dimension
#
# The mean-field Transformer PDE ∂ₜρ + div(ρ v) = (σ²/2) Δρ lives on the sphere
# S^{d−1}. This notebook solves it there and holds it against the theory and
# against tokens:
#
# 1. The linear theory in any dimension: the growth rate of each degree ℓ of the
#    uniform state, the fastest degree (Bruno, Pasqualotto & Agazzi, 2025), the
#    critical noise and Mun & Rosenzweig's type change β_*^{(d)} (2026).
# 2. A zonal density on S² and S³ beside tokens drawn from it.
# 3. Stationary states with noise on S²: a continuous transition for softmax, a
#    hysteresis loop for unnormalised attention.
# 4. The full density on S²: clusters from a small random perturbation, their
#    number against the fastest degree, and the density as an animation.
# 5. A general, anisotropic kernel e^{⟨Qx, Ky⟩} on S².
#
# The derivations are in [The density on the sphere](../math/sphere.md).
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
# ## 1. The linear theory in any dimension
#
# Every spherical harmonic of degree ℓ grows at
# λ_ℓ = ℓ(ℓ+d−2) [I_{ℓ+d/2−1}(β) / (β I_{d/2−1}(β)) − σ²/2] (softmax). The rate
# per eigenvalue of the Laplacian decreases in ℓ, so degree 1 sets the critical
# noise; the fastest degree grows like √(2β) in every dimension.

# %%
beta = 9.0
ell = np.arange(1, 16)
fig, axes = plt.subplots(1, 2, figsize=(10, 3.8), layout="constrained")
for d in (2, 3, 4, 8):
    axes[0].plot(ell, density.growth_rate(ell, beta, d=d), "o-", ms=3, label=f"d = {d}")
axes[0].set(xlabel="degree ℓ", ylabel="growth rate λ_ℓ", title=f"β = {beta:g}, softmax")
axes[0].legend()
betas = np.geomspace(0.1, 100, 60)
for d in (2, 3, 4, 8):
    axes[1].loglog(betas, density.critical_noise(betas, d=d), label=f"softmax, d = {d}")
    axes[1].loglog(
        betas[betas < 50],
        density.critical_noise(betas[betas < 50], "unnormalized", d=d),
        "--",
        label=f"unnormalised, d = {d}",
    )
axes[1].set(
    xlabel="β", ylabel="critical noise σ_c", title="every degree decays above σ_c"
)
axes[1].legend(fontsize=7, ncol=2)
finish(fig, "11_linear_theory")
for d in (2, 3, 4):
    modes = [density.fastest_mode(b, d=d) for b in (1, 5, 9, 25, 100)]
    print(f"d = {d}: fastest degree at beta = 1, 5, 9, 25, 100: {modes}")
for d in range(2, 9):
    print(
        f"d = {d}: beta_* = {density.type_change_beta('unnormalized', d=d):.6f}, "
        f"softmax type change: {density.type_change_beta('softmax', d=d)}"
    )

# %% [markdown]
# ## 2. A zonal density on S² and S³ beside tokens
#
# A density of the angle θ to an axis stays one. `simulate_zonal` solves it by
# finite volumes in θ (positive, conservative, second order); `sample_zonal`
# draws tokens from it, `simulate_tokens` runs them, and `zonal_w1` compares the
# angles. The W1 distance is the tokens' sampling error, ~1/√n, plus the
# instability's amplification of it.

# %%
N = 256 if SMOKE_TEST else 1024
n = 256 if SMOKE_TEST else 4096
t1 = 3.0
ts = np.linspace(0, t1, 7)
fig, axes = plt.subplots(1, 2, figsize=(10, 3.8), layout="constrained")
for d, ax in zip((3, 4), axes, strict=True):
    theta = (np.arange(N) + 0.5) * np.pi / N
    rho0 = np.exp(2 * np.cos(theta)) + 0.5 * np.exp(-8 * (theta - 2.0) ** 2)
    rho0 /= rho0 @ density.zonal_volumes(N, d)
    sol = density.simulate_zonal(rho0, t1, beta=4.0, d=d, saveat=ts)
    x0 = density.sample_zonal(jax.random.key(0), rho0, n, d)
    tokens = density.simulate_tokens(x0, t1, beta=4.0, saveat=ts)
    w1 = [
        density.zonal_w1(sol.rho[i], density.zonal_angles(np.asarray(tokens.x[i])), d)
        for i in range(ts.size)
    ]
    for i in (0, 3, 6):
        ax.plot(theta, sol.rho[i], label=f"density, t = {ts[i]:g}")
        angles = density.zonal_angles(np.asarray(tokens.x[i]))
        hist, edges = np.histogram(angles, bins=48, range=(0, np.pi))
        cell = density.zonal_volumes(48, d)
        ax.step(edges[:-1], hist / n / cell, where="post", lw=0.8, alpha=0.7)
    ax.set(xlabel="θ (angle to the axis)", ylabel="ρ", title=f"S^{d - 1}, β = 4")
    ax.legend(fontsize=7)
    print(
        f"S^{d - 1}: {sol.status}, mass error {abs(sol.mass - 1).max():.1e}, "
        f"W1(tokens, density) = {np.round(w1, 4)} (n = {n})"
    )
finish(fig, "11_zonal")

# %% [markdown]
# ## 3. Stationary states with noise on S²
#
# Below σ_c the uniform state gives way to a cluster. Softmax attention grows it
# continuously (κ > 0 in every dimension); unnormalised attention above
# β_*^{(3)} = 1.816 jumps, and the cluster survives above σ_c up to a fold:
# hysteresis.

# %%
ratios = np.linspace(0.4, 1.4, 11 if SMOKE_TEST else 41) + 0.005
fig, axes = plt.subplots(1, 2, figsize=(10, 3.6), layout="constrained")
for attention, ax in zip(("softmax", "unnormalized"), axes, strict=True):
    sigma_c = float(density.critical_noise(4.0, attention, d=3))
    sweep = density.noise_continuation_zonal(
        4.0, ratios * sigma_c, 3, attention, N=128 if SMOKE_TEST else 256
    )
    ax.plot(ratios, sweep.from_cluster, "-", label="from the cluster (σ up)")
    ax.plot(ratios, sweep.from_uniform, ".", label="from the uniform state (σ down)")
    ax.axvline(1, color="k", lw=0.8)
    kappa = density.landau_coefficient(4.0, attention, d=3)
    ax.set(
        xlabel="σ / σ_c",
        ylabel="order parameter |∫ x ρ|",
        title=f"{attention}, β = 4, S²: κ = {kappa:.3f}",
    )
    ax.legend(fontsize=8)
    print(
        f"{attention}: converged {sweep.converged}, bistable at", ratios[sweep.bistable]
    )
finish(fig, "11_hysteresis")

# %% [markdown]
# ## 4. Clusters from noise on S²
#
# `simulate_sphere` solves the full density by spherical harmonics. From the
# uniform density plus a small random perturbation of the degrees up to L/2, the
# degrees near ℓ* = `fastest_mode(β, d=3)` win; their positive lobes become the
# clusters — about ℓ*(ℓ*+1)/(2√3) of them, the maxima of a random degree-ℓ*
# harmonic, not ℓ* as on the circle. Noise keeps them resolved.

# %%
L = 24 if SMOKE_TEST else 64
beta, sigma = 16.0, 0.15
grid = density.sphere_grid(L)
rng = np.random.default_rng(0)
coeffs = rng.standard_normal((L, L)) + 1j * rng.standard_normal((L, L))
degree, order = np.arange(L)[:, None], np.arange(L)[None, :]
coeffs = np.where((order <= degree) & (degree >= 1) & (degree <= L // 2), coeffs, 0)
coeffs[:, 0] = coeffs[:, 0].real
values = np.array(
    density.sphere_values(jax.numpy.asarray(coeffs), np.asarray(grid.nodes))
).reshape(grid.shape)
weights = np.asarray(grid.weights).reshape(grid.shape)
values /= np.sqrt(np.sum(values**2 * weights) / (4 * np.pi))
rho0 = 1 + 1e-3 * values
rho0 /= np.sum(rho0 * weights)
t1 = 6.0 if SMOKE_TEST else 30.0
ts = np.linspace(0, t1, 61)
sol = density.simulate_sphere(rho0, t1, beta=beta, sigma=sigma, saveat=ts)
counts = [density.count_sphere_clusters(r, level=2.0) for r in sol.rho]
lstar = density.fastest_mode(beta, sigma=sigma, d=3)
print(f"{sol.status}, {sol.num_steps} steps, mass error {abs(sol.mass - 1).max():.1e}")
maxima = lstar * (lstar + 1) / (2 * np.sqrt(3))
print(f"fastest degree {lstar}: l*(l*+1)/(2 sqrt 3) = {maxima:.1f}")
print("clusters over time:", counts[::6])
fig = mf.plotting.plot_sphere_density(
    sol, [0, 20, 40, 60], title=f"β = {beta:g}, σ = {sigma:g}"
)
finish(fig, "11_sphere_maps")
if not SMOKE_TEST:
    mf.plotting.animate_sphere_density(
        sol, OUT / "11_sphere.gif", max_frames=31, title=f"β = {beta:g}"
    )

# %% [markdown]
# ## 5. An anisotropic kernel on S²
#
# With Q ≠ K the kernel e^{⟨Qx, Ky⟩} is no longer a function of ⟨x, y⟩, and the
# interaction is a quadrature over the grid's nodes, the same sum as the particle
# field on the nodes as weighted atoms. Here Qᵀ K stretches one axis: the
# clusters line up along it.

# %%
L = 12 if SMOKE_TEST else 24
grid = density.sphere_grid(L)
x = np.asarray(grid.nodes).reshape(grid.shape + (3,))
weights = np.asarray(grid.weights).reshape(grid.shape)
rho0 = 1 + 0.5 * (x[..., 0] ** 3 - 3 * x[..., 0] * x[..., 1] ** 2)  # degree 3
rho0 /= np.sum(rho0 * weights)
Q, K, V = np.diag([1.0, 1.0, 3.0]), 2.0 * np.eye(3), np.eye(3)
ts = np.linspace(0, 2.0, 5)
sol = density.simulate_sphere(rho0, 2.0, Q=Q, K=K, V=V, sigma=0.5, saveat=ts)
print(sol.status, f"mass error {abs(sol.mass - 1).max():.1e}")
fig = mf.plotting.plot_sphere_density(sol, [0, 2, 4], title="Q = diag(1, 1, 3), K = 2I")
finish(fig, "11_anisotropic")
