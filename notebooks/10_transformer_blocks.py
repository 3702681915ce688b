# ---
# jupyter:
#   jupytext:
#     formats: py:percent
# ---

# %% [markdown]
# # Transformer blocks: feed-forward layers, positions and the hardmax limit
#
# A Transformer layer is attention followed by a feed-forward layer, on tokens
# that carry positions. In continuous depth the block moves each token by
# Γ_μ(x) + F(x), with F a token-wise field (`mf.Block`). This notebook runs the
# pieces the recent literature on these dynamics studies:
#
# 1. A feed-forward layer beside attention on the circle: a rotation F(x) = ωJx
#    commutes with the dynamics, an MLP changes which clusters form.
# 2. Layers against the ODE: a Transformer layer (attention step, then
#    feed-forward step) is first order in the step; Strang splitting is second
#    order.
# 3. ALiBi on tokens with positions: the slope decides how far back a token looks,
#    and how many clusters survive along the sequence.
# 4. Hardmax attention, the β → ∞ limit of softmax: how fast finite-β
#    trajectories approach it.
# 5. An affine feed-forward layer on a Gaussian: the blow-up time against the
#    layer's growth rate, solved and in closed form.
#
# The derivations are in [Feed-forward layers and
# blocks](../math/transformer-blocks.md), [Positional
# attention](../math/positional.md), [Hardmax attention](../math/hardmax.md) and
# [Gaussians](../math/gaussians.md#math-gaussian-feedforward). `SMOKE_TEST=1` runs
# a small version.

# %%
import os
from pathlib import Path

import jax
import matplotlib.pyplot as plt
import numpy as np

import meanfield as mf

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


def on_circle(angles):
    return np.stack([np.cos(angles), np.sin(angles)], axis=-1)


def angles_of(x):
    return np.mod(np.arctan2(x[..., 1], x[..., 0]), 2 * np.pi)


# %% [markdown]
# ## 1. A feed-forward layer beside attention
#
# Tokens on the circle under softmax attention with A = βI, V = I
# (`normalization="sphere"`) gather into clusters. A feed-forward layer
# F(x) = ωJx, J the rotation by π/2, turns every token at angular speed ω. Attention
# with A = βI is invariant under rotations, so the block's solution is the
# attention-only solution rotated by ωt: the block changes nothing but the frame.
# An MLP is not equivariant: it pulls tokens towards its own preferred directions,
# and the clusters differ.

# %%
n, beta, t1 = (32, 4.0, 4.0) if SMOKE_TEST else (128, 4.0, 12.0)
omega = 1.5
angles0 = np.random.default_rng(0).uniform(0, 2 * np.pi, n)
mu = mf.Particles(on_circle(angles0))
attn = mf.SoftmaxAttention(np.eye(2), A=beta * np.eye(2))
J = np.array([[0.0, -1.0], [1.0, 0.0]])
rotation = mf.Block(attn, mf.FeedForward(omega * J))
rng = np.random.default_rng(1)
mlp = mf.Block(
    attn,
    mf.MLP(
        rng.normal(size=(8, 2)),
        rng.normal(size=8),
        rng.normal(size=(2, 8)),
        None,
        "tanh",
    ),
)
ts = np.linspace(0, t1, 121)
runs = {
    name: mf.simulate(
        mu, field, t1, saveat=ts, normalization="sphere", rtol=1e-10, atol=1e-10
    )
    for name, field in (("attention", attn), ("+ rotation", rotation), ("+ MLP", mlp))
}
back = (
    np.asarray(runs["+ rotation"].x)
    @ np.array(
        [
            [np.cos(-omega * t1), -np.sin(-omega * t1)],
            [np.sin(-omega * t1), np.cos(-omega * t1)],
        ]
    ).T
)
gap = np.abs(back[-1] - np.asarray(runs["attention"].x[-1])).max()
print(
    f"rotated back by -omega t1, the rotation block equals attention alone to {gap:.1e}"
)
for name, sol in runs.items():
    number = mf.clustering.detect(np.asarray(sol.x[-1])).number
    print(f"{name:>11}: {number} clusters at t = {t1:g}")

fig, axes = plt.subplots(1, 3, figsize=(11, 3.4), sharey=True)
for ax, (name, sol) in zip(axes, runs.items(), strict=True):
    ax.plot(ts, angles_of(np.asarray(sol.x)), ".", ms=0.6, color="C0")
    ax.set_title(name)
    ax.set_xlabel("t")
axes[0].set_ylabel("angle")
fig.tight_layout()
finish(fig, "10_feedforward_circle")

# %% [markdown]
# ## 2. Layers against the ODE
#
# `mf.layers` runs a block as a Transformer does: x ← x + hΓ(x), then
# x ← x + hF(x) (`splitting="lie"`). The composition differs from the flow of
# Γ + F by O(h²) per layer, so the error at depth t₁ is O(h): first order.
# `splitting="strang"` composes half a feed-forward step, an attention step and
# half a feed-forward step, each by the midpoint rule: second order.

# %%
Ls = np.array([8, 16, 32, 64] if SMOKE_TEST else [8, 16, 32, 64, 128, 256])
small = mf.Particles(on_circle(angles0[:16]))
block = mf.Block(attn, mlp.feedforward)
exact = mf.simulate(
    small, block, 1.0, normalization="sphere", solver="dopri8", rtol=1e-12, atol=1e-12
).x[-1]
errors = {
    splitting: np.array(
        [
            np.abs(
                mf.layers(
                    small, block, int(L), normalization="sphere", splitting=splitting
                ).x[-1]
                - exact
            ).max()
            for L in Ls
        ]
    )
    for splitting in ("lie", "strang")
}
fig, ax = plt.subplots(figsize=(5, 3.6))
for splitting, err in errors.items():
    slope = np.polyfit(np.log(Ls), np.log(err), 1)[0]
    ax.loglog(Ls, err, "o-", label=f"{splitting}: slope {slope:.2f}")
    print(
        f"{splitting}: fitted slope {slope:.2f}, error at L = {Ls[-1]}: {err[-1]:.1e}"
    )
ax.set_xlabel("layers L")
ax.set_ylabel("error at t = 1")
ax.legend()
fig.tight_layout()
finish(fig, "10_splitting")

# %% [markdown]
# ## 3. ALiBi: how far back a token looks
#
# With positions s = i/n (`mf.MaskedParticles`), causal ALiBi attention adds
# −λ(sᵢ − sⱼ) to the logits (λ = m n for the discrete slope m). Token i weighs the
# earlier tokens by exp(−λ(sᵢ − sⱼ)): with λ = 0 every token sees the whole past
# and the sequence follows its first tokens; with a large λ each token sees a window
# of width about 1/λ, and clusters form locally along the sequence (a window of
# a few tokens keeps most tokens where they started). Below, the final angle of
# every token against its position, for several slopes.

# %%
n_seq = 64 if SMOKE_TEST else 256
t_seq = 10.0 if SMOKE_TEST else 30.0
angles_seq = np.random.default_rng(2).uniform(0, 2 * np.pi, n_seq)
tokens = mf.MaskedParticles(on_circle(angles_seq), np.arange(n_seq) / n_seq)
fig, ax = plt.subplots(figsize=(6, 3.6))
for slope in (0.0, 10.0, 50.0, 250.0):
    alibi = mf.ALiBiAttention(np.eye(2), A=beta * np.eye(2), slope=slope)
    final = np.asarray(mf.simulate(tokens, alibi, t_seq, normalization="sphere").x[-1])
    number = mf.clustering.detect(final).number
    ax.plot(
        np.arange(n_seq) / n_seq, angles_of(final), ".", ms=3, label=f"λ = {slope:g}"
    )
    print(f"slope {slope:>5g}: {number} clusters at t = {t_seq:g}")
ax.set_xlabel("position s")
ax.set_ylabel("final angle")
ax.legend(fontsize=8)
fig.tight_layout()
finish(fig, "10_alibi")

# %% [markdown]
# ## 4. The hardmax limit
#
# Replacing A by βA and letting β → ∞, softmax attention tends to hardmax
# attention: each token moves towards the tokens it scores highest
# (`mf.HardmaxAttention`). On a bounded time interval the trajectories converge;
# Alcalde, Bungert, Riedl & Roith (arXiv 2605.10931) bound the distance by
# order √(log(β+1)/β). Here: 16 tokens in the plane with A = I, V = I, the largest
# distance over tokens and times between the softmax and hardmax solutions. The
# bound holds for any data; these tokens have no near-tie, and their distance
# falls like exp(−βg), g the smallest gap between a best and a second-best logit
# (past β ≈ 300 the two solutions agree to the last bit in float64). A token
# nearly tied between two keys keeps an O(1) distance until β resolves its gap
# ([Hardmax attention](../math/hardmax.md), `benchmarks/hardmax_rate.py`).

# %%
x_plane = np.random.default_rng(3).normal(size=(16, 2))
plane = mf.Particles(x_plane)
t_hard = 1.0
ts_hard = np.linspace(0, t_hard, 51)
hard = mf.simulate(
    plane,
    mf.HardmaxAttention(np.eye(2), A=np.eye(2)),
    t_hard,
    saveat=ts_hard,
    rtol=1e-10,
    atol=1e-10,
).x
betas = np.geomspace(1, 60, 5 if SMOKE_TEST else 12)
distances = np.array(
    [
        np.abs(
            mf.simulate(
                plane,
                mf.SoftmaxAttention(np.eye(2), A=b * np.eye(2)),
                t_hard,
                saveat=ts_hard,
                rtol=1e-10,
                atol=1e-10,
            ).x
            - hard
        ).max()
        for b in betas
    ]
)
for b, dist in zip(betas[::2], distances[::2], strict=True):
    print(f"beta = {b:6.1f}: max distance {dist:.2e}")
fig, ax = plt.subplots(figsize=(5, 3.6))
ax.loglog(betas, distances, "o-", label="softmax(βA) − hardmax")
ax.loglog(betas, np.sqrt(np.log(betas + 1) / betas), "--", label="√(log(β+1)/β)")
ax.set_xlabel("β")
ax.set_ylabel("max distance on [0, 1]")
ax.legend(fontsize=8)
fig.tight_layout()
finish(fig, "10_hardmax")

# %% [markdown]
# ## 5. A feed-forward layer on a Gaussian
#
# An affine layer F(x) = Wx + b keeps Gaussians Gaussian (Alcalde, Ji & Zuazua,
# arXiv 2606.07600): the moment ODE gains Wα + b and WΣ + ΣWᵀ. With V = I the
# precision P = Σ⁻¹ solves a linear ODE, and for W = wI the blow-up time of
# attention alone, t₀*, becomes t* = log(1 + 2wt₀*)/(2w): a growing layer
# (w > 0) brings the blow-up forward, a contracting one delays it, and below
# w = −1/(2t₀*) prevents it. The solved blow-up times of `mf.gaussian.simulate`
# against this closed form:

# %%
gauss = mf.Gaussian(mean=[0.5, 0.0], cov=np.eye(2))
attn_g = mf.SoftmaxAttention(np.eye(2), A=np.array([[0.8, 0.5], [-0.5, 0.8]]))
t0 = 1 / 1.6  # A + Aᵀ = 1.6 I, Σ₀ = I
ws = np.linspace(-0.75, 1.0, 8 if SMOKE_TEST else 36)
solved = np.array(
    [
        float(
            mf.gaussian.simulate(
                gauss, attn_g, 5.0, ffn=mf.FeedForward(w * np.eye(2))
            ).blowup_time
        )
        for w in ws
    ]
)
with np.errstate(divide="ignore", invalid="ignore"):
    exact = np.where(
        1 + 2 * ws * t0 > 0,
        np.log1p(2 * ws * t0) / (2 * np.where(ws == 0, 1, ws)),
        np.inf,
    )
exact = np.where(ws == 0, t0, exact)
finite = np.isfinite(exact) & (exact <= 5)
print(
    f"largest relative error of the solved blow-up times: "
    f"{np.max(np.abs(solved[finite] / exact[finite] - 1)):.1e}"
)
print(
    f"no blow-up for w <= {-1 / (2 * t0):.3f}: "
    f"{bool(np.all(np.isinf(solved[ws <= -1 / (2 * t0)])))}"
)
fig, ax = plt.subplots(figsize=(5, 3.6))
ax.plot(ws, exact, "-", label="log(1 + 2wt₀*)/(2w)")
ax.plot(
    ws, np.where(np.isfinite(solved), solved, np.nan), "o", mfc="none", label="solved"
)
ax.axvline(-1 / (2 * t0), color="gray", ls=":")
ax.set_xlabel("w (F(x) = w x)")
ax.set_ylabel("blow-up time t*")
ax.legend(fontsize=8)
fig.tight_layout()
finish(fig, "10_gaussian_ffn")
