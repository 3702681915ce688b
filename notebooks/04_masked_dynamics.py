# ---
# jupyter:
#   jupytext:
#     formats: py:percent
# ---

# %% [markdown]
# # Masked (causal) attention: early tokens lead
#
# Castin, Ablin, Carrillo & Peyré, "A Unified Perspective on the Dynamics of Deep
# Transformers" (2025), Def. 2.6: every token carries a position s ∈ [0, 1] that never
# moves, and token i attends to token j iff s_j ≤ s_i. With s_i = i/n this is the
# causal attention of decoder-only Transformers. In meanfield the mask is selected by
# passing `mf.MaskedParticles(x, positions)` instead of `mf.Particles(x)`.
#
# The first token (smallest s) sees only itself, so its velocity is Γ(x_1) = V x_1;
# on the sphere with V = I the projection (I − x_1 x_1ᵀ) V x_1 vanishes and it never
# moves. Token 2 sees tokens 1 and 2, token 3 sees 1, 2, 3, ...: every token is pulled
# toward the ones before it, and the whole sequence ends in the first token's cluster
# (Karagodin, Polyanskiy & Rigollet, "Clustering in Causal Attention Masking",
# NeurIPS 2024, prove convergence to a single cluster for V = I and any Q, K, and
# relate the long-lived intermediate clusters to Rényi's parking problem). Without
# the mask the tokens also merge, but the cluster forms elsewhere and token 1 moves
# like any other.
#
# Setting: Q = K = V = I, tokens on the unit circle (d = 2), the LayerNorm model
# `normalization="sphere"`. `SMOKE_TEST=1` runs a small version.

# %%
import os
from pathlib import Path

import jax
import jax.numpy as jnp
import matplotlib.pyplot as plt
import numpy as np
from matplotlib.collections import LineCollection

import meanfield as mf

jax.config.update("jax_enable_x64", True)
SMOKE_TEST = os.environ.get("SMOKE_TEST") == "1"
n, d = (32, 2) if SMOKE_TEST else (256, 2)
t1 = 40.0
TOL = 1e-2  # "joined the first token's cluster": |x_i - x_1| < TOL from then on

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


# %%
x0 = np.random.default_rng(0).standard_normal((n, d))
x0 = jnp.asarray(x0 / np.linalg.norm(x0, axis=1, keepdims=True))
s = jnp.arange(n) / n  # causal attention: token i sees tokens 0..i
attn = mf.SoftmaxAttention(jnp.eye(d), A=jnp.eye(d))
masked = mf.MaskedParticles(x0, s)

velocity = jax.jit(lambda mu: attn.velocity(mu))

# The first token sees only itself: Gamma(x_1) = V x_1 exactly.
v0 = np.asarray(velocity(masked))
assert np.allclose(v0[0], np.asarray(x0[0]), rtol=0, atol=1e-12)
print("velocity of token 1:", v0[0], "= V x_1 =", np.asarray(x0[0]))

# All positions equal: nobody is masked, this is plain softmax attention.
unmasked = mf.MaskedParticles(x0, jnp.zeros(n))
gap = np.abs(np.asarray(velocity(unmasked) - velocity(mf.Particles(x0)))).max()
print(f"equal positions vs unmasked: max velocity difference {gap:.1e}")
assert gap < 1e-12

# %% [markdown]
# Two runs from the same tokens. The unmasked run is written as masked attention
# with all positions equal (s_j ≤ s_i for every pair: nobody is masked), which is
# exactly softmax attention and reuses the compiled solver of the masked run.

# %%
ts = jnp.linspace(0.0, t1, 241)
runs = {
    "masked (causal)": mf.simulate(masked, attn, t1, saveat=ts, normalization="sphere"),
    "unmasked": mf.simulate(unmasked, attn, t1, saveat=ts, normalization="sphere"),
}
ts = np.asarray(ts)
X = {name: np.asarray(sol.x) for name, sol in runs.items()}
for name, sol in runs.items():
    assert sol.status == "success", (name, sol.status)
dist = {name: np.linalg.norm(x - x[:, :1], axis=-1) for name, x in X.items()}
moved = {name: np.abs(x[:, 0] - x[0, 0]).max() for name, x in X.items()}
for name in runs:
    centre = X[name][-1].mean(axis=0)
    centre /= np.linalg.norm(centre)
    print(
        f"{name:16s} token 1 moved by {moved[name]:.2e}; at t = {t1:g} the farthest "
        f"token is {dist[name][-1].max():.2e} from token 1; the cluster centre is "
        f"{np.linalg.norm(centre - np.asarray(x0[0])):.3f} from x_1(0)"
    )
assert moved["masked (causal)"] < 1e-10  # token 1 does not move
assert moved["unmasked"] > 1e-2  # ... unless nothing is masked
assert dist["masked (causal)"][-1].max() < TOL  # everyone ends at token 1

# %% [markdown]
# ## Trajectories, coloured by position
#
# The angle θ_i(t) of every token on the circle, continuous in time and shifted by a
# multiple of 2π so that every token ends within π of token 1's final angle. Dark
# tokens come first in the sequence, yellow ones last; token 1 is the thick black
# line. In the masked run token 1 is a horizontal line; intermediate (meta-stable)
# clusters, each gathered around an early token, form first, and they merge into the
# first token's cluster later. Without the mask all tokens meet somewhere else, and
# token 1 travels there like any other token.


# %%
def angles(x):
    """Angle of each token, continuous in time, ending within pi of token 1's."""
    theta = np.unwrap(np.arctan2(x[..., 1], x[..., 0]), axis=0)
    theta = theta - 2 * np.pi * np.round(theta[-1:, :1] / (2 * np.pi))
    return theta - 2 * np.pi * np.round((theta[-1:] - theta[-1:, :1]) / (2 * np.pi))


def colored_paths(ax, ts, values, s, cmap="viridis"):
    """One line per token, t -> values[:, i], coloured by the position s_i."""
    segs = np.stack([np.broadcast_to(ts[:, None], values.shape), values], axis=-1)
    lines = LineCollection(
        np.swapaxes(segs, 0, 1), cmap=cmap, linewidths=0.8, alpha=0.8
    )
    lines.set_array(np.asarray(s))
    ax.add_collection(lines)
    ax.autoscale_view()
    return lines


fig, axes = plt.subplots(1, 2, figsize=(11, 4.2), sharey=True, layout="constrained")
for ax, (name, x) in zip(axes, X.items(), strict=True):
    theta = angles(x)
    lines = colored_paths(ax, ts, theta, s)
    ax.plot(ts, theta[:, 0], "k", lw=2.2, label="token 1 (s = 0)")
    ax.set_xlabel("t")
    ax.set_title(name)
    ax.legend(loc="upper right", fontsize="small")
axes[0].set_ylabel(r"angle $\theta_i(t)$ on the circle")
fig.colorbar(lines, ax=axes, label="position s")
finish(fig, "04_masked_angles")

# %% [markdown]
# ## How early tokens lead
#
# Left: the distance |x_i(t) − x_1(t)| of every token to the first one in the masked
# run (log scale), coloured by position. Right: the time at which each token joins
# the first token's cluster (|x_i − x_1| < 10⁻² from then on) against its position.
# With the mask the join time grows with the position. Once the tokens are close to
# x_1 their attention weights are nearly uniform over the tokens they see, so the
# displacement ξₖ = xₖ − x₁ follows ξₖ′ ≈ (ξ₁ + … + ξₖ)/k − ξₖ: a lower-
# triangular system in which every token is fed the errors of all the tokens before
# it, with rates 1 − 1/k (token 2, which only sees token 1 and itself, is the slowest:
# exp(−t/2)). The errors pile up along the sequence, and the join time grows like a
# logarithm of the index k: the dashed curve is the fit t_k ≈ a + b log(k − 1).
# Without the mask the position plays no role.


# %%
def join_times(dist, ts, tol=TOL):
    """Time after which dist[:, i] < tol for good (inf: not by t1).

    Linear interpolation of log(dist) between the last save time above `tol` and
    the next one; 0 for a token that is within `tol` from the start.
    """
    above = dist >= tol
    out = np.full(dist.shape[1], np.inf)
    out[~above.any(axis=0)] = 0.0
    for i in np.flatnonzero(above.any(axis=0) & ~above[-1]):
        k = np.flatnonzero(above[:, i])[-1]
        lo, hi = np.log(dist[k, i]), np.log(max(dist[k + 1, i], 1e-300))
        out[i] = ts[k] + (ts[k + 1] - ts[k]) * (lo - np.log(tol)) / (lo - hi)
    return out


def rank_correlation(a, b):
    """Spearman's rho, with tied values given their average rank."""

    def ranks(v):
        r = np.empty(v.size)
        r[np.argsort(v, kind="stable")] = np.arange(v.size)
        _, inverse = np.unique(v, return_inverse=True)
        return (np.bincount(inverse, weights=r) / np.bincount(inverse))[inverse]

    return float(np.corrcoef(ranks(np.asarray(a)), ranks(np.asarray(b)))[0, 1])


joins = {name: join_times(dist[name], ts) for name in runs}
rho = {}
for name, jt in joins.items():
    ok = np.isfinite(jt)
    ok[0] = False  # token 1 itself
    rho[name] = rank_correlation(np.asarray(s)[ok], jt[ok])
    print(
        f"{name:16s} joined by t = {t1:g}: {ok.sum() + 1}/{n}; rank correlation of "
        f"join time with position: {rho[name]:+.3f}; median join time "
        f"{np.median(jt[ok]):.2f}"
    )
half = n // 2
jm = joins["masked (causal)"]
k = np.arange(1, n + 1)
b, a = np.polyfit(np.log(k[2:] - 1), jm[2:], 1)
print(
    f"masked: mean join time {jm[1:half].mean():.2f} (first half), "
    f"{jm[half:].mean():.2f} (second half); fit t_k = {a:.2f} + {b:.2f} log(k - 1)"
)
assert np.all(np.isfinite(jm))
assert jm[half:].mean() > jm[1:half].mean()
assert rho["masked (causal)"] > 0.5

# %%
fig, (ax_d, ax_j) = plt.subplots(1, 2, figsize=(11, 4.2), layout="constrained")
lines = colored_paths(ax_d, ts, np.log10(np.maximum(dist["masked (causal)"], 1e-16)), s)
ax_d.axhline(np.log10(TOL), color="k", ls=":", lw=1)
ax_d.set_ylim(-8, 0.5)
ax_d.set_xlabel("t")
ax_d.set_ylabel(r"$\log_{10} |x_i(t) - x_1(t)|$")
ax_d.set_title("masked: distance to the first token")
fig.colorbar(lines, ax=ax_d, label="position s")
for name, marker in zip(runs, "os", strict=True):
    ax_j.plot(
        np.asarray(s)[1:],
        joins[name][1:],
        marker,
        ms=4,
        alpha=0.8,
        label=f"{name} (rank corr. {rho[name]:+.2f})",
    )
ax_j.plot(
    np.asarray(s)[2:],
    a + b * np.log(k[2:] - 1),
    "k--",
    lw=1,
    label=f"{a:.1f} + {b:.2f} log(k - 1), token k at s = (k - 1)/n",
)
ax_j.set_xlabel("position s")
ax_j.set_ylabel(r"time to join token 1 ($|x_i - x_1| < 10^{-2}$)")
ax_j.set_title("later tokens join later (masked)")
ax_j.legend(fontsize="small")
finish(fig, "04_masked_join_times")

# %% [markdown]
# ## Positions matter: the conditional Wasserstein distance
#
# The same token cloud with its positions shuffled is the same measure on x, so the
# Wasserstein distance between the two clouds is 0, yet the masked dynamics differ:
# the token with the smallest position leads, and the sequence collapses onto it.
# The conditional distance of Castin et al. (Def. 4.1, `mf.wasserstein.conditional`)
# only moves mass between tokens at equal positions, so it sees the difference; it is
# the metric in which they prove masked attention well posed.

# %%
perm = np.random.default_rng(1).permutation(n)
shuffled = mf.MaskedParticles(x0, s[perm])  # token i now sits at position s[perm[i]]
sol_shuffled = mf.simulate(
    shuffled, attn, t1, saveat=jnp.asarray(ts), normalization="sphere"
)
leader = int(np.argmin(perm))  # the token now at position 0
W = mf.wasserstein
w_clouds = float(W.distance(mf.Particles(x0), mf.Particles(x0)))
w_cond0 = float(W.conditional(masked, shuffled))
w_cond1 = float(
    W.conditional(runs["masked (causal)"].measure(-1), sol_shuffled.measure(-1))
)
end = np.asarray(sol_shuffled.x[-1])
print(
    f"W2 between the clouds: {w_clouds:.2e}; conditional W2 at t = 0: {w_cond0:.3f}, "
    f"at t = {t1:g}: {w_cond1:.3f}"
)
print(
    f"shuffled run ends {np.abs(end - np.asarray(x0[leader])).max():.2e} from its "
    f"leader (token {leader}), {np.linalg.norm(np.asarray(x0[leader] - x0[0])):.3f} "
    "from token 1"
)
assert w_clouds < 1e-12 and w_cond0 > 0.1
assert np.abs(end - np.asarray(x0[leader])).max() < TOL
