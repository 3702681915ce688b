"""The covariance ODE in scale-shape coordinates on a rate clock.

See docs/math/blowup.md.

Sigma' = B Sigma + Sigma B^T is solved as Sigma = e^l S with tr S = 1:

    S' = G - (tr G / tr S) S,   l' = tr G / tr S,   G = B S + S B^T,

where (B, b) is the attention's affine field on N(., Sigma) (B does not depend on
the mean for any family, so the mean is not tracked). The independent variable is
a clock s with dt/ds = 1 / (1 + |B|_F): |B| is the rate at which the Gaussian
moves, so on the s clock every rate is O(1). For softmax (B = V Sigma A, |B| ~ e^l)
this is the time tau of the homogeneous shape flow dS/dtau = F(S) - g S, in which a
blow-up is S approaching a fixed point with g > 0 (l ~ g tau) and a huge steady
rank-deficient Sigma is a fixed point with g = 0: both are smooth and reached in
O(1) steps, where in t the first is a singularity and the second stiff (its
linearisation scales with |Sigma|). For L2 and Sinkhorn |B| stays bounded and s is
t up to a bounded factor.

State of one run: y = [S (d*d, row-major), l, t, beta], beta = log of the
blow-up-free growth bound, beta' = 2 r(t) (`_ode.value_rate`).
"""

import jax
import jax.numpy as jnp

from ._ode import value_rate
from ._velocity import summed_affine


def pack(cov, t0, dtype):
    """Initial state [S, l, t0, 0] of N(., cov)."""
    cov = jnp.asarray(cov, dtype)
    trace = jnp.trace(cov)
    d = cov.shape[0]
    return jnp.concatenate(
        [(cov / trace).reshape(d * d), jnp.stack([jnp.log(trace), t0, 0.0 * t0])]
    )


def unpack(y, d):
    """(S (d, d) symmetrised, l, t, beta) of a state."""
    S = y[: d * d].reshape(d, d)
    return (S + S.T) / 2, y[d * d], y[d * d + 1], y[d * d + 2]


def time_field(y, attn, d, growth=None):
    """d/dt of [S, l, t, beta] (the t-component is 1) and |B|_F.

    `growth` is beta' = 2 r when the parameters do not depend on t (computed once
    per run: r costs singular values); None evaluates it at t.
    """
    S, ell, t, _ = unpack(y, d)
    B, _ = summed_affine(attn, jnp.zeros(d, y.dtype), jnp.exp(ell) * S, t)
    G = B @ S + S @ B.T
    G = (G + G.T) / 2
    rate = jnp.trace(G) / jnp.trace(S)
    if growth is None:
        growth = 2 * value_rate(attn, t, d)
    tail = jnp.stack([rate, jnp.ones_like(rate), jnp.asarray(growth, y.dtype)])
    return jnp.concatenate([(G - rate * S).reshape(d * d), tail]), jnp.linalg.norm(B)


def log_rate(y, attn, d):
    """The rate l' = d log tr Sigma / dt at a state."""
    dy, _ = time_field(y, attn, d, growth=0.0)
    return dy[d * d]


def log_rate_derivative(y, attn, d):
    """The derivative l'' along the flow (forward mode through the field)."""
    dy, _ = time_field(y, attn, d, growth=0.0)
    return jax.jvp(lambda z: log_rate(z, attn, d), (y,), (dy,))[1]


def depends_on_time(static) -> bool:
    """Whether an attention's static part holds parameter functions of t."""
    return any(callable(leaf) for leaf in jax.tree.leaves(static))
