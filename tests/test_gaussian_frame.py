"""The covariance ODE in the moving orthogonal frame (docs/math/blowup.md).

References: Sigma' = B Sigma + Sigma B^T differentiated through the factors, dense
inverses where they are accurate, and an independent SciPy solve of the L2 runs in
P = Sigma^{-1}, where their huge direction is P's null direction and every
quantity is well conditioned.
"""

import jax
import jax.numpy as jnp
import jax.random as jr
import numpy as np
import pytest
from scipy.integrate import solve_ivp

import meanfield as mf
from meanfield import _status
from meanfield._linalg import graded_tilt
from meanfield.gaussian import _frame, _scale_shape


def _random_state(key, d, spread):
    """A frame state with a random Q, log-scales over `spread` and a random U."""
    kq, kg, ku = jr.split(key, 3)
    Q, _ = jnp.linalg.qr(jr.normal(kq, (d, d)))
    g = jnp.sort(jr.uniform(kg, (d,), minval=-spread, maxval=spread))[::-1]
    upper = 0.5 * jr.normal(ku, (d * (d - 1) // 2,))
    return jnp.concatenate([Q.reshape(-1), g, upper, jnp.array([0.0, 0.3, 0.0])])


def _attentions(d, key):
    ka, kv, kk = jr.split(key, 3)
    A = jr.normal(ka, (d, d)) / np.sqrt(d)
    V = jnp.eye(d) + 0.3 * jr.normal(kv, (d, d))
    return {
        "softmax": mf.SoftmaxAttention(V, A=A),
        "l2": mf.L2Attention(V, Q=A, K=jnp.eye(d) + 0.2 * jr.normal(kk, (d, d))),
        "sinkhorn": mf.SinkhornAttention(V, A=A),
    }


@pytest.mark.parametrize("family", ["softmax", "l2", "sinkhorn"])
@pytest.mark.parametrize("d", [2, 4])
def test_frame_field_moves_sigma_by_the_moment_ode(family, d):
    # d/dt of Sigma(y) along the frame field is B Sigma + Sigma B^T, B from the
    # family's own gaussian_field on the formed Sigma (moderate spread, where
    # forming Sigma is exact to rounding).
    key = jr.fold_in(jr.key(3), d)
    y = _random_state(key, d, spread=1.0)
    attn = _attentions(d, jr.fold_in(key, 1))[family]
    dy, speed = _frame.time_field(y, attn, d, growth=0.0)
    cov, dcov = jax.jvp(lambda z: _frame.covariance(z, d), (y,), (dy,))
    B, _ = mf.gaussian.velocity(mf.Gaussian(jnp.zeros(d), cov), attn)
    expected = B @ cov + cov @ B.T
    np.testing.assert_allclose(dcov, expected, atol=1e-12 * np.abs(expected).max())
    np.testing.assert_allclose(speed, jnp.linalg.norm(B), rtol=1e-12)
    # l' = tr Sigma' / tr Sigma, and Q stays orthogonal to first order.
    np.testing.assert_allclose(dy[-3], jnp.trace(expected) / jnp.trace(cov), rtol=1e-12)
    Q = y[: d * d].reshape(d, d)
    dQ = dy[: d * d].reshape(d, d)
    np.testing.assert_allclose(Q.T @ dQ + dQ.T @ Q, 0.0, atol=1e-13)


def test_frame_state_of_a_scale_shape_state_is_the_same_sigma():
    d = 3
    M = jr.normal(jr.key(5), (d, d))
    cov = M @ M.T + 0.1 * jnp.eye(d)
    y = _scale_shape.pack(cov, jnp.asarray(0.7), jnp.float64)
    z = _frame.from_scale_shape(y, d)
    assert z.shape == (_frame.size(d),)
    np.testing.assert_allclose(_frame.covariance(z, d), cov, rtol=1e-12)
    np.testing.assert_allclose(z[-3:], y[-3:])
    g = z[d * d : d * d + d]
    assert np.all(np.diff(g) <= 0)  # the frame starts ordered


def test_graded_tilt_keeps_small_directions_of_a_huge_sigma():
    # (Sigma^{-1} + G)^{-1} with r = (e^15, 0.3): forming Sigma = 1e13 scale
    # rounds the small direction to ~1e-3 relative; the factored form does not.
    # Reference: the same matrix from P = Sigma^{-1}, built from the factors'
    # inverses (every entry well scaled), plus G, inverted densely.
    Q, _ = jnp.linalg.qr(jr.normal(jr.key(7), (2, 2)))
    r = jnp.array([np.exp(15.0), 0.3])
    U = jnp.array([[1.0, 0.7], [0.0, 1.0]])
    G = jnp.array([[2.0, 0.3], [0.3, 1.5]])
    U_inv = jnp.linalg.inv(U)
    P = Q @ (U_inv.T / r[:, None]) @ (U_inv / r[None, :]) @ Q.T
    expected = jnp.linalg.inv(P + G)
    got = graded_tilt(Q, r, U, G)
    np.testing.assert_allclose(got, expected, rtol=1e-12)
    R = r[:, None] * U
    formed = jnp.linalg.inv(jnp.linalg.inv(Q @ R @ R.T @ Q.T) + G)
    assert np.abs(formed - expected).max() > 1e3 * np.abs(got - expected).max()


# Two d = 2 L2 runs (K = I) whose huge direction grows at l' ~ 6 to tr Sigma ~
# 1e13-1e14 by t = 5; the complement, ~0.05, sits below rounding of Sigma.
# Solved in scale-shape coordinates they exhausted the step budget.
L2_RUNS = [
    (
        [
            [1.389387839239928, -1.5583395995360652],
            [-1.4035339290151205, 0.16330750223362478],
        ],
        [
            [1.6906061839778097, 0.14856527287899896],
            [-0.3722572072167937, 1.3934414707384235],
        ],
    ),
    (
        [
            [-0.29813887394460514, 0.5999368051675115],
            [1.236624398343648, 2.1076359880287594],
        ],
        [
            [1.140064551257887, 0.12044911258088607],
            [-0.3369508461478459, 1.4039956570706462],
        ],
    ),
]


def _l2_rate_in_precision(A, V, t_max):
    """l'(t_max) from SciPy's DOP853 on P = Sigma^{-1}, K = I.

    P' = -(P B + B^T P) with B = 2 V (P + 2 I)^{-1} A: bounded and well
    conditioned. Sigma's huge direction is P's null vector u, and
    l' = 2 u^T B u up to the complement's share (~1e-15 here).
    """
    A, V = np.asarray(A), np.asarray(V)

    def field(t, p):
        P = p.reshape(2, 2)
        B = 2 * V @ np.linalg.solve(P + 2 * np.eye(2), A)
        return (-(P @ B + B.T @ P)).ravel()

    sol = solve_ivp(
        field, (0, t_max), np.eye(2).ravel(), method="DOP853", rtol=1e-13, atol=1e-16
    )
    P = sol.y[:, -1].reshape(2, 2)
    lam, vecs = np.linalg.eigh((P + P.T) / 2)
    u = vecs[:, 0]
    assert lam[0] < 1e-12 * lam[1]  # Sigma is that huge
    return 2 * u @ (2 * V @ np.linalg.solve(P + 2 * np.eye(2), A)) @ u


def test_l2_runs_with_a_huge_direction_get_their_rate():
    As, Vs = (jnp.asarray([run[i] for run in L2_RUNS]) for i in (0, 1))
    attns = jax.vmap(lambda A, V: mf.L2Attention(V, Q=A, K=jnp.eye(2)))(As, Vs)
    study = mf.gaussian.blowup_times(
        mf.Gaussian(np.zeros(2), np.eye(2)), {"l2": attns}, 5.0
    )
    assert np.all(study.status["l2"] == _status.SUCCESS)
    assert np.all(study.rank["l2"] == 1)
    for k, (A, V) in enumerate(L2_RUNS):
        # The rate is a derivative at the end of a 5-unit solve at rtol 1e-8 with
        # growth ~6.6: ~100 rtol.
        np.testing.assert_allclose(
            study.rate["l2"][k], _l2_rate_in_precision(A, V, 5.0), rtol=1e-5
        )
