"""The covariance ODE in a moving orthogonal frame (continuous QR; docs/math/blowup.md).

Sigma' = B Sigma + Sigma B^T is Sigma = Y Y^T with Y' = B Y. Writing Y = Q R with Q
orthogonal and R = diag(e^g) U upper triangular (U unit upper) and T = Q^T B Q:

    Q' = Q (L - L^T),   g' = diag T,
    U_ij' = sum_{k>i} (T_ik + T_ki) e^{g_k - g_i} U_kj,

with L the strictly lower part of T (the Lyapunov-exponent "continuous QR"). Every
scale of Sigma is a log, e^{g_i} to full relative precision whatever the spread:
where Sigma is a huge direction and a complement 10^-7 of it, the complement lives
in g and U, not in the last digits of a trace-normalised matrix. The frame orders
itself: the first column of Q follows the most expanded direction, so for i < k
the factors e^{g_k - g_i} stay bounded. When B is bounded (L2, Sinkhorn) every rate
here is bounded too, and the stiffness that scale-shape coordinates show on such
runs (rates e^l |B| in S) is gone.

State of one run: y = [Q (d*d, row-major), g (d), U above the diagonal
(d(d-1)/2, row-major), l, t, beta], with l = log tr Sigma and beta as in
`_scale_shape` (the last three entries, at the same negative indices).
"""

import jax
import jax.numpy as jnp

from .._linalg import safe_eigh
from . import _scale_shape
from ._ode import value_rate
from ._velocity import affine_graded


def size(d: int) -> int:
    """Length of a state in dimension d."""
    return d * d + d + d * (d - 1) // 2 + 3


def from_scale_shape(y, d):
    """The frame state of the same Sigma: eigenvectors of S by decreasing eigenvalue.

    Eigenvalues of S below eps^2 of the largest (rounding) are raised to it, so
    that every log is finite.
    """
    S, ell, t, beta = _scale_shape.unpack(y, d)
    lam, vecs = safe_eigh(S)
    lam, vecs = lam[::-1], vecs[:, ::-1]
    floor = lam[0] * jnp.finfo(y.dtype).eps ** 2
    g = (ell + jnp.log(jnp.maximum(lam, floor))) / 2
    upper = jnp.zeros(d * (d - 1) // 2, y.dtype)
    return jnp.concatenate([vecs.reshape(d * d), g, upper, jnp.stack([ell, t, beta])])


def unpack(y, d):
    """(Q (d, d), g (d,), U (d, d) unit upper, l, t, beta) of a state."""
    Q = y[: d * d].reshape(d, d)
    g = y[d * d : d * d + d]
    rows, cols = jnp.triu_indices(d, 1)
    U = jnp.eye(d, dtype=y.dtype).at[rows, cols].set(y[d * d + d : -3])
    return Q, g, U, y[-3], y[-2], y[-1]


def _scaled_gram(g, U):
    """R R^T / e^{2 max g} (d, d): Sigma in the frame, scaled to a top entry ~1."""
    R = jnp.exp(g - jnp.max(g))[:, None] * U
    return R @ R.T


def covariance(y, d):
    """Sigma (d, d) of a state (overflows where e^{2 max g} does)."""
    Q, g, U, *_ = unpack(y, d)
    return jnp.exp(2 * jnp.max(g)) * (Q @ _scaled_gram(g, U) @ Q.T)


def shape(y, d):
    """Sigma / tr Sigma (d, d), computed without forming Sigma."""
    Q, g, U, *_ = unpack(y, d)
    P = Q @ _scaled_gram(g, U) @ Q.T
    P = (P + P.T) / 2
    return P / jnp.trace(P)


def _frame_rates(y, attn, d):
    """(T = Q^T B Q, P = scaled R R^T, |B|_F) at a state."""
    Q, g, U, _, t, _ = unpack(y, d)
    B, _ = affine_graded(attn, jnp.zeros(d, y.dtype), Q, jnp.exp(g), U, t)
    return Q.T @ B @ Q, _scaled_gram(g, U), jnp.linalg.norm(B)


def time_field(y, attn, d, growth=None):
    """d/dt of the state (the t-component is 1) and |B|_F.

    `growth` is beta' = 2 r when the parameters do not depend on t; None evaluates
    it at t.
    """
    Q, g, U, _, t, _ = unpack(y, d)
    T, P, speed = _frame_rates(y, attn, d)
    lower = jnp.tril(T, -1)
    # R' = (T - (L - L^T)) R: upper triangular, T_ij + T_ji above the diagonal.
    upper = jnp.triu(T, 1) + lower.T
    dU = (upper * jnp.exp(g[None, :] - g[:, None])) @ U
    rows, cols = jnp.triu_indices(d, 1)
    rate = 2 * jnp.trace(T @ P) / jnp.trace(P)  # l' = tr Sigma' / tr Sigma
    if growth is None:
        growth = 2 * value_rate(attn, t, d)
    tail = jnp.stack([rate, jnp.ones_like(rate), jnp.asarray(growth, y.dtype)])
    dQ = Q @ (lower - lower.T)
    return jnp.concatenate(
        [dQ.reshape(d * d), jnp.diag(T), dU[rows, cols], tail]
    ), speed


def relative_rate(y, attn, d):
    """|Sigma'|_F / |Sigma|_F at a state (frame-invariant: Q is orthogonal)."""
    T, P, _ = _frame_rates(y, attn, d)
    G = T @ P
    return jnp.linalg.norm(G + G.T) / jnp.linalg.norm(P)


def log_rate(y, attn, d):
    """The rate l' = d log tr Sigma / dt at a state."""
    dy, _ = time_field(y, attn, d, growth=0.0)
    return dy[-3]


def log_rate_derivative(y, attn, d):
    """The derivative l'' along the flow (forward mode through the field)."""
    dy, _ = time_field(y, attn, d, growth=0.0)
    return jax.jvp(lambda z: log_rate(z, attn, d), (y,), (dy,))[1]
