# ---
# jupyter:
#   jupytext:
#     formats: py:percent
# ---

# %% [markdown]
# # Wasserstein stability of the Transformer PDE
#
# Two nearby initial token distributions μ₀, ν₀ stay close under attention
# dynamics: W_p(μ(t), ν(t)) ≤ C(t, R₀) W_p(μ₀, ν₀), with a Gronwall constant
# C = exp ∫ L(R(s)) ds built from the mean-field Lipschitz constant of the velocity
# field on the support (Geshkovski, Letrouit, Polyanskiy & Rigollet, 2023, for
# softmax; Castin, Ablin, Carrillo & Peyré, 2025, for masked attention, where the
# conditional distance replaces W_p). `mf.wasserstein.stability` simulates both
# measures, measures the exact (or conditional) W₂ at every time and evaluates the
# bound. The bound is valid but loose: the figure puts the measured ratio beside it.
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

jax.config.update("jax_enable_x64", True)
SMOKE_TEST = os.environ.get("SMOKE_TEST") == "1"
n, d = (16, 2) if SMOKE_TEST else (64, 2)
ts = np.linspace(0.0, 1.0, 5 if SMOKE_TEST else 21)

# %% [markdown]
# ν₀ is μ₀ with every token moved by about 10⁻³ in a random direction.

# %%
key_x, key_dx = jax.random.split(jax.random.key(0))
# Tokens in the ball of radius R0 = 0.3: the bound is finite there (it grows like
# exp(R^2 e^{2 R^2}) with the support radius R, and is vacuous beyond R ~ 1).
g = jax.random.normal(key_x, (n, d))
x0 = 0.3 * g / jnp.linalg.norm(g, axis=-1).max()
y0 = x0 + 1e-3 * jax.random.normal(key_dx, (n, d))
positions = jnp.arange(n) / n
cases = {
    "softmax": (
        mf.Particles(x0),
        mf.Particles(y0),
        mf.SoftmaxAttention(jnp.eye(d), A=jnp.eye(d)),
    ),
    "masked softmax": (
        mf.MaskedParticles(x0, positions),
        mf.MaskedParticles(y0, positions),
        mf.SoftmaxAttention(jnp.eye(d), A=jnp.eye(d)),
    ),
}
if not SMOKE_TEST:
    cases["L2"] = (
        mf.Particles(x0),
        mf.Particles(y0),
        mf.L2Attention(jnp.eye(d), Q=jnp.eye(d), K=jnp.eye(d)),
    )
results = {}
for name, (mu0, nu0, attn) in cases.items():
    st = mf.wasserstein.stability(mu0, nu0, attn, ts, rtol=1e-9, atol=1e-9)
    results[name] = st
    print(
        f"{name:15s} ({st.method}) ratio at t = 1: {st.ratio[-1]:.3f}, "
        f"bound {st.bound[-1]:.3g} (log {st.log_bound[-1]:.3g}), "
        f"radius {st.radius[-1]:.3f} <= {st.radius_bound[-1]:.3f}"
    )
    assert st.within_bounds(), name

# %% [markdown]
# The measured ratio grows mildly on [0, 1]; the bound grows like exp(∫ L(R(s)) ds)
# with L evaluated at the support radius, so it sits orders of magnitude above the
# ratio, more so for the masked measure (its constant carries the Hardy/Copson
# factor of the prefix averages). The radius stays under R₀ exp(∫|V|). Full run
# (n = 64, R₀ = 0.3, t = 1): ratio 1.11 vs bound 46 (softmax), 1.49 vs 1.1e3
# (masked, conditional W₂), 1.12 vs 1.2e14 (L2, whose constant is far looser).

# %%
for name, st in results.items():
    fig = plotting.plot_stability(st, title=name)
    plt.close(fig)
