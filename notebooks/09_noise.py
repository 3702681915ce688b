# ---
# jupyter:
#   jupytext:
#     formats: py:percent
# ---

# %% [markdown]
# # Noisy tokens: order, disorder and antipodal clusters
#
# Tokens on the circle under attention with A = βI, V = I gather into clusters.
# A Brownian forcing on every token competes with that attraction: below a
# critical noise σ_c(β) the tokens order into one cluster, above it they stay
# spread (Mun & Rosenzweig, 2026; arXiv 2604.16288, 2606.05140). A noise shared by
# all tokens, as random value matrices shared by a layer produce, does something
# else: two tokens end either aligned or antipodal, with a probability in closed
# form (Fedorov, Sander, Elie, Marion & Laurière, 2026; arXiv 2601.21942).
#
# 1. Tokens with independent noise, `mf.IndependentNoise(σ)`, below and above
#    σ_c: an ensemble of noisy systems and its order parameter against t.
# 2. The same on the density, ∂ₜρ + ∂_θ(ρv) = (σ²/2)∂²_θρ (`mf.density.simulate`),
#    and its stationary state (`mf.density.stationary`) against the tokens.
# 3. The phase transition: continuous for softmax attention, discontinuous (with
#    hysteresis) for unnormalised attention above Mun & Rosenzweig's β_*.
# 4. Common noise, `mf.CommonNoise(σ)`: the probability that two tokens end
#    antipodal, theory against Monte Carlo.
#
# The equations and their solvers are in [Noise](../math/noise.md) and
# [The density on the circle](../math/density.md). `SMOKE_TEST=1` runs a small
# version.

# %%
import os
from pathlib import Path

import jax
import jax.numpy as jnp
import matplotlib.pyplot as plt
import numpy as np
from scipy.optimize import brentq
from scipy.special import iv

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


def statistics_and_tokens(sol):
    """Per system: the statistics at every save, and the tokens at the last one."""
    return mf.clustering.statistics(sol), sol.x[:, -1]


def centred_angles(x, at=np.pi):
    """Angles in [0, 2 pi) of each system's tokens, rotated so that its mean
    direction is `at` (None: not rotated)."""
    x = np.asarray(x)
    angles = np.arctan2(x[..., 1], x[..., 0])
    if at is not None:
        mean = x.mean(axis=-2)
        angles = angles + (at - np.arctan2(mean[..., 1], mean[..., 0]))[..., None]
    return np.mod(angles, 2 * np.pi)


# %% [markdown]
# ## 1. Order and disorder in an ensemble of noisy systems
#
# Each token θᵢ on the circle moves by dθᵢ = v(θᵢ) dt + σ dWᵢ, with v the softmax
# attention field and W¹, …, Wⁿ independent Brownian motions
# (`noise=mf.IndependentNoise(σ)`, `normalization="sphere"`). Linearised at the
# uniform state, the mean direction exp(iθ) grows at
# λ₁ = I₁(β)/(βI₀(β)) − σ²/2 ([the critical
# noise](../math/density.md#math-density-critical)), so the uniform state loses
# stability below the critical noise σ_c, σ_c² = 2I₁(β)/(βI₀(β))
# (`mf.density.critical_noise`).
#
# The order parameter r = |(1/n) Σᵢ exp(iθᵢ)| (`mf.clustering.order_parameter`) is
# of order 1/√n for spread tokens and of order 1 for a cluster. Below σ_c it
# rises to the order of the stationary density of section 2. Above σ_c the mean
# direction of n tokens is, linearised, an Ornstein–Uhlenbeck process,
# dc = −½(σ² − σ_c²) c dt + (σ/√n) dZ, whose stationary mean square is
# E r² = 1/(n(1 − σ_c²/σ²)): the interaction keeps r above 1/√n, more so near σ_c.
#
# β = 1 here: its fastest mode is k = 1 below σ_c, so one cluster forms directly.
# At larger β modes k ≥ 2 grow faster and the tokens pass through metastable
# states of several clusters first (the Metastability tutorial).
#
# One ensemble holds both noise levels (`sigma` of shape (B,)), each member on the
# Brownian path of its own key; `reduce=` keeps the statistics and the final tokens
# inside the compiled solve. Fixed steps (`dt0`, Euler–Maruyama, the scheme of a
# normalised residual stack) suffice for statistics. In the figure, thin lines
# are six single systems.

# %%
beta = 1.0
sigma_c = density.critical_noise(beta)
levels = np.array([0.5, 1.5]) * sigma_c
systems, n = (4, 32) if SMOKE_TEST else (32, 128)
t1, dt0 = (4.0, 0.1) if SMOKE_TEST else (20.0, 0.05)
ts = np.linspace(0, t1, 41)

theta0 = jax.random.uniform(jax.random.key(0), (systems, n), maxval=2 * np.pi)
x0 = jnp.stack([jnp.cos(theta0), jnp.sin(theta0)], axis=-1)
x0 = jnp.concatenate([x0, x0])  # the same initial tokens at both noise levels
stats, tokens = mf.simulate_ensemble(
    jax.vmap(mf.Particles)(x0),
    mf.SoftmaxAttention(jnp.eye(2), A=beta * jnp.eye(2)),
    t1,
    normalization="sphere",
    noise=jax.vmap(mf.IndependentNoise)(jnp.repeat(levels, systems)),
    key=jax.random.key(1),
    solver="euler",
    dt0=dt0,
    saveat=ts,
    reduce=statistics_and_tokens,
)
order = np.asarray(stats.order_parameter).reshape(2, systems, -1)
tokens = np.asarray(tokens).reshape(2, systems, n, 2)
late = ts >= t1 / 2

stationary_order = density.stationary(beta, levels[0]).order
spread = 1 / np.sqrt(n * (1 - (sigma_c / levels[1]) ** 2))  # RMS above sigma_c
print(f"beta = {beta:g}: sigma_c = {sigma_c:.4f}; {2 * systems} systems x {n} tokens")
print(
    f"sigma = 0.5 sigma_c: r at t1 {order[0, :, -1].mean():.3f}"
    f" +- {order[0, :, -1].std() / np.sqrt(systems):.3f};"
    f" stationary density {stationary_order:.3f}"
)
print(
    f"sigma = 1.5 sigma_c: RMS r over t >= {t1 / 2:g}"
    f" {np.sqrt(np.mean(order[1][:, late] ** 2)):.3f};"
    f" 1/sqrt(n(1 - sigma_c^2/sigma^2)) = {spread:.3f},"
    f" 1/sqrt(n) = {1 / np.sqrt(n):.3f}"
)

# %%
fig, ax = plt.subplots(figsize=(7.5, 4.5), layout="constrained")
for i, (r, colour) in enumerate(zip(order, ["C0", "C3"], strict=True)):
    ax.plot(ts, r[:6].T, color=colour, lw=0.5, alpha=0.35)
    ax.fill_between(
        ts, *np.quantile(r, [0.1, 0.9], axis=0), color=colour, alpha=0.15, lw=0
    )
    ax.plot(
        ts,
        r.mean(axis=0),
        color=colour,
        lw=2.2,
        label=f"σ = {levels[i] / sigma_c:g} σ_c: mean, 10–90 % of {systems} systems",
    )
ax.axhline(
    stationary_order,
    color="C0",
    ls="--",
    lw=1,
    label="order of the stationary density (σ = 0.5 σ_c)",
)
ax.axhline(spread, color="C3", ls="-.", lw=1, label="1/√(n(1 − σ_c²/σ²)) (σ = 1.5 σ_c)")
ax.axhline(1 / np.sqrt(n), color="0.3", ls=":", lw=1.2, label="1/√n")
ax.set_xlabel("t")
ax.set_ylabel("order parameter r")
ax.set_ylim(0, 1.02)
ax.set_title(f"softmax, β = {beta:g}, n = {n} tokens on the circle")
ax.legend(loc="center right", fontsize=8)
finish(fig, "09_order_parameter")

# %% [markdown]
# ## 2. The density: heat maps and the stationary state
#
# As n → ∞ the empirical measure of the noisy tokens solves the McKean–Vlasov
# equation ∂ₜρ + ∂_θ(ρv) = (σ²/2)∂²_θρ (Mun & Rosenzweig, 2026). Its stationary
# states have zero flux, ρv = (σ²/2)ρ′, that is log ρ = 2 log Z/(βσ²) + const
# with Z(θ) = ∫exp(β cos(θ−φ)) ρ(φ) dφ
# ([noise-driven phase transitions](../how-to/noise-phase.md));
# `mf.density.stationary` solves this fixed point directly. Below, the density
# starts from a bump ρ₀ ∝ exp(cos(θ−π)): below σ_c it sharpens into the stationary
# cluster, above σ_c it flattens to the uniform state 1/2π. On the right, the
# density at t₁ and the stationary state are drawn over the final tokens of
# section 1. Below σ_c each system is rotated so that its mean direction is π
# (the cluster sits anywhere on the circle); above σ_c the angles are drawn as
# they are, since rotating spread tokens by their mean direction would itself
# make a bump of relative height about 2r.

# %%
N = 64 if SMOKE_TEST else 256
theta = density.cell_centres(N)
rho0 = np.exp(np.cos(theta - np.pi))
rho0 /= rho0.sum() * 2 * np.pi / N
runs = [density.simulate(rho0, t1, beta=beta, sigma=s, saveat=ts) for s in levels]
states = [density.stationary(beta, s, N=N) for s in levels]
for s, sol, state in zip(levels, runs, states, strict=True):
    gap = np.abs(sol.rho[-1] - np.roll(state.rho, N // 2)).max() / state.rho.max()
    print(
        f"sigma = {s / sigma_c:g} sigma_c: {sol.status}, {sol.num_steps} steps;"
        f" stationary order {state.order:.4f}, residual {state.residual:.1e};"
        f" max |rho(t1) - stationary| / max rho = {gap:.1e}"
    )

# %%
fig = plt.figure(figsize=(15, 4.2), layout="constrained")
axes = fig.subplots(1, 3, width_ratios=[1, 1, 1.15])
for ax, s, sol in zip(axes[:2], levels, runs, strict=True):
    mf.plotting.plot_density(
        sol, axes=[ax], title=f"density, β = {beta:g}, σ = {s / sigma_c:g} σ_c"
    )
ax = axes[2]
edges = np.linspace(0, 2 * np.pi, 49)
for i, (s, sol, state, colour) in enumerate(
    zip(levels, runs, states, ["C0", "C3"], strict=True)
):
    angles = centred_angles(tokens[i], np.pi if s < sigma_c else None)
    ax.hist(
        angles.ravel(),
        bins=edges,
        density=True,
        color=colour,
        alpha=0.3,
        label=f"{systems * n} tokens, σ = {s / sigma_c:g} σ_c",
    )
    ax.plot(
        theta,
        sol.rho[-1],
        color=colour,
        lw=2.5,
        alpha=0.6,
        label=f"density at t = {t1:g}",
    )
    ax.plot(
        theta,
        np.roll(state.rho, N // 2),
        color="k",
        lw=1,
        ls="--",
        label="stationary" if i == 0 else None,
    )
ax.set_xlim(0, 2 * np.pi)
ax.set_xlabel("θ")
ax.set_ylabel("ρ")
ax.set_title(f"t = {t1:g}: tokens, density and stationary state")
ax.legend(fontsize=8, loc="upper left")
finish(fig, "09_density")

# %% [markdown]
# ## 3. Continuous or discontinuous: the phase transition
#
# Along the branch of clustered states that leaves the uniform state at σ_c,
# σ_c²/σ² = 1 + κr² + O(r⁴) (`mf.density.landau_coefficient` is κ). With κ > 0 the
# cluster grows like √(σ_c − σ) below σ_c: a continuous transition. With κ < 0 the
# branch bends to noise above σ_c before it folds back, and the uniform state
# jumps to a finite cluster at σ_c: a discontinuous transition, with hysteresis
# between σ_c and the fold. For softmax attention κ > 0 at every β. For
# unnormalised attention κ changes sign at β_*, which Mun & Rosenzweig (2026)
# characterise by I₂(β_*)/I₁(β_*) = 1/2 (their coupling K is 1/σ²);
# `mf.density.type_change_beta` finds it as the root of κ.
#
# `mf.density.noise_continuation` follows the stable states along σ from both
# sides: down from the uniform state, up from the cluster. Where they differ, both
# are stable (shaded). `mf.density.cluster_branch` prescribes r instead of σ and
# passes the fold, so it also gives the unstable part of the branch.

# %%
beta_type = density.type_change_beta("unnormalized")
beta_bessel = brentq(lambda b: iv(2, b) / iv(1, b) - 0.5, 0.5, 10.0, xtol=1e-15)
print(f"type_change_beta('unnormalized') = {beta_type:.13f}")
print(f"I2/I1 = 1/2 (Mun & Rosenzweig)    = {beta_bessel:.13f}")
print(f"type_change_beta('softmax') = {density.type_change_beta('softmax')}")

betas = [1.5, 8.0]
fractions = np.linspace(0.605, 1.305, 15 if SMOKE_TEST else 71)  # avoids sigma_c
cells = 128 if SMOKE_TEST else 512
fig, axes = plt.subplots(1, 2, figsize=(12, 4.2), layout="constrained", sharey=True)
for ax, b in zip(axes, betas, strict=True):
    for attention, colour in [("softmax", "C0"), ("unnormalized", "C3")]:
        sweep = density.noise_continuation(
            b, fractions * density.critical_noise(b, attention), attention, N=cells
        )
        kappa = density.landau_coefficient(b, attention)
        ax.plot(
            fractions,
            sweep.from_cluster,
            color=colour,
            lw=1.8,
            label=f"{attention} (κ = {kappa:+.2f}): up from the cluster",
        )
        ax.plot(
            fractions,
            sweep.from_uniform,
            color=colour,
            ls="none",
            marker="o",
            mfc="none",
            ms=4,
            label=f"{attention}: down from the uniform state",
        )
        bistable = fractions[sweep.bistable]
        if bistable.size:
            ax.axvspan(bistable[0], bistable[-1], color=colour, alpha=0.12, lw=0)
            branch = density.cluster_branch(
                b, np.linspace(0.02, 0.9, 12 if SMOKE_TEST else 45), attention, N=cells
            )
            unstable = ~branch.stable
            ax.plot(
                branch.sigma[unstable] / branch.sigma_c,
                branch.order[unstable],
                color=colour,
                ls="--",
                lw=1.2,
                label=f"{attention}: unstable branch",
            )
            print(
                f"beta = {b:g}, {attention}: both states stable for sigma/sigma_c in"
                f" [{bistable[0]:.3f}, {bistable[-1]:.3f}], fold at"
                f" {branch.fold / branch.sigma_c:.3f}"
            )
        else:
            print(f"beta = {b:g}, {attention}: no hysteresis (kappa = {kappa:+.3f})")
    ax.axvline(1, color="0.4", lw=0.8)
    side = "<" if b < beta_type else ">"
    ax.set_title(f"β = {b:g} {side} β_* = {beta_type:.3f}")
    ax.set_xlabel("σ / σ_c")
    ax.legend(fontsize=7.5, loc="lower left")
axes[0].set_ylabel("order parameter r of the stable states")
finish(fig, "09_phase_transition")

# %% [markdown]
# ## 4. Common noise: aligned or antipodal
#
# With `noise=mf.CommonNoise(σ)` all tokens feel one d × d Brownian matrix B
# (entries of variance t/d): dxᵢ = Γ(xᵢ) dt + σ dB xᵢ, projected on the sphere.
# This is the common matrix noise of Fedorov, Sander, Elie, Marion & Laurière
# (2026; arXiv 2601.21942) applied to the tokens. Aligned tokens stay aligned,
# but two tokens can also be held apart: ρ = ⟨x₁, x₂⟩ converges to +1 or −1, and
# the probability of −1 follows from the scale function of ρ
# (`mf.clustering.antipodal_probability(..., noise="tokens", sigma=σ)`). It is 0
# unless β exceeds `antipodal_threshold` (−1 then attracts).
#
# The Monte Carlo runs two orthogonal tokens in d = 3 over independent keys, at a
# few β at once (one attention per member), and counts the runs with ρ < 0 at t₁.
#
# In the paper's own model the value matrices are the noise and there is no
# attention drift (`noise="values"`): the probability then depends on β and d
# only, and is positive exactly when cosh 2β > d − 2
# (β_c = arccosh(d − 2)/2, `antipodal_threshold(d=d)`); right panel.

# %%
d, sigma = 3, 1.5
mc_betas = np.array([0.5, 2.0]) if SMOKE_TEST else np.array([0.5, 1.0, 2.0, 4.0])
repeats = 16 if SMOKE_TEST else 256
t_end, dt_common = (4.0, 0.1) if SMOKE_TEST else (20.0, 0.05)


def final_inner_product(sol):
    """<x_1, x_2> of each member at its last save."""
    x = sol.x[:, -1]
    x = x / jnp.linalg.norm(x, axis=-1, keepdims=True)
    return jnp.sum(x[:, 0] * x[:, 1], axis=-1)


members = jnp.repeat(jnp.asarray(mc_betas), repeats)
rho_end = mf.simulate_ensemble(
    jax.vmap(mf.Particles)(jnp.broadcast_to(jnp.eye(d)[:2], (members.size, 2, d))),
    jax.vmap(lambda b: mf.SoftmaxAttention(jnp.eye(d), A=b * jnp.eye(d)))(members),
    t_end,
    normalization="sphere",
    noise=mf.CommonNoise(sigma),
    key=jax.random.key(2),
    solver="euler",
    dt0=dt_common,
    reduce=final_inner_product,
)
rho_end = np.asarray(rho_end).reshape(mc_betas.size, repeats)
p_mc = np.mean(rho_end < 0, axis=1)
p_err = np.sqrt(p_mc * (1 - p_mc) / repeats)
p_theory = mf.clustering.antipodal_probability(
    0.0, mc_betas, d=d, sigma=sigma, noise="tokens"
)
beta_tokens = mf.clustering.antipodal_threshold(d=d, sigma=sigma, noise="tokens")
print(f"tokens, d = {d}, sigma = {sigma:g}: threshold beta = {beta_tokens:.4f}")
print(f"{repeats} runs per beta, t = {t_end:g}")
undecided = np.mean(np.abs(rho_end) < 0.9)
print(f"undecided runs (|rho| < 0.9 at t = {t_end:g}): {undecided:.3f}")
for b, p, e, q in zip(mc_betas, p_mc, p_err, p_theory, strict=True):
    print(f"  beta = {b:g}: P(antipodal) {p:.3f} +- {e:.3f}, theory {q:.3f}")
for dim in (3, 8, 32):
    beta_c = mf.clustering.antipodal_threshold(d=dim)
    print(
        f"values, d = {dim}: beta_c = {beta_c:.4f},"
        f" cosh(2 beta_c) = {np.cosh(2 * beta_c):g} = d - 2"
    )

# %%
curve = np.linspace(0, 4, 41 if SMOKE_TEST else 161)
fig, axes = plt.subplots(1, 2, figsize=(12, 4.2), layout="constrained")
ax = axes[0]
ax.plot(
    curve,
    mf.clustering.antipodal_probability(0.0, curve, d=d, sigma=sigma, noise="tokens"),
    color="C0",
    label="theory",
)
ax.errorbar(
    mc_betas,
    p_mc,
    yerr=2 * p_err,
    fmt="o",
    color="k",
    capsize=3,
    label=f"{repeats} runs per β (±2 s.e.)",
)
ax.axvline(beta_tokens, color="0.4", ls=":", label=f"threshold β = {beta_tokens:.3f}")
ax.set_title(f"mf.CommonNoise(σ = {sigma:g}), softmax drift, d = {d}, ⟨x₁, x₂⟩₀ = 0")
ax.set_xlabel("β")
ax.set_ylabel("P(two tokens end antipodal)")
ax.legend(fontsize=8)
ax = axes[1]
for dim, colour in zip((3, 8, 32), ["C0", "C1", "C2"], strict=True):
    ax.plot(
        curve,
        mf.clustering.antipodal_probability(0.0, curve, d=dim),
        color=colour,
        label=f"d = {dim}",
    )
    beta_c = mf.clustering.antipodal_threshold(d=dim)
    ax.axvline(beta_c, color=colour, ls=":", lw=1)
ax.set_title('random value matrices (noise="values"); dotted: cosh 2β_c = d − 2')
ax.set_xlabel("β")
ax.set_ylabel("P(two tokens end antipodal)")
ax.legend(fontsize=8)
for ax in axes:
    ax.set_ylim(-0.02, 0.55)
finish(fig, "09_common_noise")
