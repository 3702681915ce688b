"""Feed-forward layers in the Gaussian moment ODE (Alcalde, Ji & Zuazua, 2606.07600).

An affine feed-forward F(x) = W x + b added to an attention that is affine on
Gaussians keeps Gaussians Gaussian: alpha' gains W alpha + b, Sigma' gains
W Sigma + Sigma W^T. Derivations: docs/math/gaussians.md, "Feed-forward layers".
References here are independent: closed forms, SciPy's solve_ivp / expm / quad_vec
on NumPy fields, and particle runs.
"""

import jax
import jax.numpy as jnp
import jax.random as jr
import numpy as np
import pytest
from scipy.integrate import quad_vec, solve_ivp
from scipy.linalg import expm
from scipy.optimize import brentq

import meanfield as mf
from meanfield.gaussian._study import _needs_frame

# Tight solves: the solver's own error is then far below every tolerance below.
TIGHT = dict(rtol=1e-12, atol=1e-12)


def _rotation(theta):
    c, s = np.cos(theta), np.sin(theta)
    return np.array([[c, -s], [s, c]])


def _example(d=3, seed=0):
    """(A, W, b_f, Sigma0, alpha0): a generic, non-commuting softmax + FFN case."""
    rng = np.random.default_rng(seed)
    A = rng.normal(size=(d, d)) / np.sqrt(d) + 0.4 * np.eye(d)
    W = 0.5 * rng.normal(size=(d, d)) / np.sqrt(d)
    b = rng.normal(size=d)
    L = rng.normal(size=(d, d)) / np.sqrt(d)
    return A, W, b, L @ L.T + 0.5 * np.eye(d), rng.normal(size=d)


# ---------------------------------------------------------------- NumPy fields


def _softmax_np(alpha, S, t, V, A):
    return V @ S @ A, V @ alpha


def _l2_np(alpha, S, t, V, Q, K):
    D = np.linalg.inv(np.eye(len(alpha)) + 2 * S @ K.T @ K)
    return 2 * V @ D @ S @ K.T @ Q, V @ D @ alpha


def _moments_ivp(field, W_of, b_of, alpha0, S0, ts, with_phi=False):
    """SciPy solve of (alpha, Sigma[, Phi]) with B, b = field(alpha, S, t) + (W, b_f).

    Phi' = (B + W) Phi, Phi(0) = I: the flow map X(t) = alpha(t) + Phi (X0 - alpha0).
    """
    d = len(alpha0)

    def rhs(t, y):
        alpha, S = y[:d], y[d : d + d * d].reshape(d, d)
        B, b = field(alpha, (S + S.T) / 2, t)
        B = B + W_of(t)
        dS = B @ S + S @ B.T
        out = [B @ alpha + b + b_of(t), dS.ravel()]
        if with_phi:
            out.append((B @ y[d + d * d :].reshape(d, d)).ravel())
        return np.concatenate(out)

    y0 = [alpha0, S0.ravel()] + ([np.eye(d).ravel()] if with_phi else [])
    sol = solve_ivp(
        rhs,
        (0.0, ts[-1]),
        np.concatenate(y0),
        t_eval=ts,
        method="DOP853",
        rtol=1e-12,
        atol=1e-13,
    )
    assert sol.success
    y = sol.y.T
    out = (y[:, :d], y[:, d : d + d * d].reshape(-1, d, d))
    if with_phi:
        out = (*out, y[:, d + d * d :].reshape(-1, d, d))
    return out


def _precision(P0, M, W, t):
    """P(t) = e^{-W^T t} P0 e^{-W t} - int_0^t e^{-W^T s} M e^{-W s} ds (quad_vec)."""
    integral, _ = quad_vec(
        lambda s: expm(-W.T * s) @ M @ expm(-W * s), 0.0, t, epsabs=1e-14, epsrel=1e-13
    )
    return expm(-W.T * t) @ P0 @ expm(-W * t) - integral


def _precision_van_loan(P0, M, W, t):
    """`_precision` by one exponential (Van Loan, 1978): the top-right block of
    exp([[-W^T, M], [0, W]] t) is int_0^t e^{-W^T (t - s)} M e^{W s} ds."""
    d = len(P0)
    E = expm(np.block([[-W.T, M], [np.zeros((d, d)), W]]) * t)
    decay = np.linalg.inv(E[d:, d:])  # e^{-W t}
    return decay.T @ P0 @ decay - E[:d, d:] @ decay


# ---------------------------------------------------------------- closed forms


@pytest.mark.parametrize(
    "w",
    [0.4, 0.0, -0.3, -0.5],
    ids=["growing", "w0", "contracting", "no_blowup"],
)
def test_scalar_closed_form(w):
    # d = 1, V = 1: p = 1/sigma solves p' = -2a - 2 w p, so
    # p(t) = (p0 + a/w) e^{-2wt} - a/w and t* = log(1 + w p0 / a) / (2w).
    a, p0, alpha0, b_f = 0.7, 2.0, 0.3, 0.2
    if w == 0:
        t_star = p0 / (2 * a)
        p = lambda t: p0 - 2 * a * t  # noqa: E731
    else:
        grow = 1 + w * p0 / a
        t_star = np.log(grow) / (2 * w) if grow > 0 else np.inf
        p = lambda t: (p0 + a / w) * np.exp(-2 * w * t) - a / w  # noqa: E731
    g = mf.Gaussian([alpha0], [[1 / p0]])
    attn = mf.SoftmaxAttention(jnp.eye(1), A=jnp.array([[a]]))
    ffn = mf.FeedForward(jnp.array([[w]]), jnp.array([b_f]))
    # The library's closed form: to rounding (it is the same formula in log1p form).
    np.testing.assert_allclose(
        mf.gaussian.blowup_time(g, attn, ffn=ffn), t_star, rtol=1e-13
    )
    t1 = 5.0
    ts = np.linspace(0, min(0.95 * t_star, t1), 7)
    sol = mf.gaussian.simulate(g, attn, t1, ffn=ffn, saveat=ts, **TIGHT)
    # Dopri8 at rtol 1e-12 over a smooth stretch (p stays >= 5% of its t* margin):
    # 1e-9 relative (measured 1e-10).
    np.testing.assert_allclose(1 / np.asarray(sol.cov[:, 0, 0]), p(ts), rtol=1e-9)
    cf = mf.gaussian.closed_form(g, attn, ts, ffn=ffn)
    np.testing.assert_allclose(cf.cov[:, 0, 0], 1 / p(ts), rtol=1e-12)
    assert cf.mean is None  # alpha0 != 0: no mean formula with a feed-forward
    # Mean: alpha' = (sigma a + w + 1) alpha + b_f, against SciPy on (alpha, sigma).
    mean_ref, _ = _moments_ivp(
        lambda al, S, t: _softmax_np(al, S, t, np.eye(1), np.array([[a]])),
        lambda t: np.array([[w]]),
        lambda t: np.array([b_f]),
        np.array([alpha0]),
        np.array([[1 / p0]]),
        ts,
    )
    np.testing.assert_allclose(sol.mean, mean_ref, rtol=1e-9)
    if np.isfinite(t_star):
        assert sol.status == "blowup"
        # The solve stops ~1e-8 t* before t* (threshold 1e8 on a (t*-t)^{-1}
        # profile) and extrapolates that power law, exact to second order in the
        # gap: 1e-8 relative leaves 1e4 of margin over the measured 1e-13... 1e-12.
        np.testing.assert_allclose(float(sol.blowup_time), t_star, rtol=1e-8)
    else:
        assert sol.status == "success"
        # p0 > -a/w: p grows like (p0 + a/w) e^{-2wt} (sigma -> 0), away from the
        # unstable fixed point -a/w.
        np.testing.assert_allclose(1 / float(sol.cov[-1, 0, 0]), p(t1), rtol=1e-9)


def test_precision_solves_the_linear_ode():
    # V = I, generic non-commuting A, W: P = Sigma^{-1} solves
    # P' = -(A + A^T) - W^T P - P W (the closed form with a quadrature).
    A, W, b, S0, alpha0 = _example()
    M = A + A.T
    g = mf.Gaussian(alpha0, S0)
    attn = mf.SoftmaxAttention(jnp.eye(3), A=jnp.asarray(A))
    ffn = mf.FeedForward(jnp.asarray(W), jnp.asarray(b))
    P0 = np.linalg.inv(S0)
    # The two evaluations of P(t) agree (quadrature against one exponential).
    np.testing.assert_allclose(
        _precision(P0, M, W, 0.7), _precision_van_loan(P0, M, W, 0.7), atol=1e-12
    )
    lam_min = lambda t: np.linalg.eigvalsh(_precision_van_loan(P0, M, W, t))[0]  # noqa: E731
    grid = np.linspace(0, 5, 51)
    first = np.flatnonzero(np.array([lam_min(t) for t in grid]) <= 0)[0]
    t_star = brentq(lam_min, grid[first - 1], grid[first], xtol=1e-15, rtol=1e-15)
    ts = np.linspace(0, 0.9 * t_star, 5)
    sol = mf.gaussian.simulate(g, attn, 5.0, ffn=ffn, saveat=ts, **TIGHT)
    want = np.stack([np.linalg.inv(_precision(P0, M, W, t)) for t in ts])
    # Dopri8 at rtol 1e-12 and quad_vec at 1e-13; Sigma grows ~10x by 0.9 t*,
    # its condition number with it: 1e-8 relative.
    np.testing.assert_allclose(sol.cov, want, rtol=1e-8, atol=1e-10)
    assert sol.status == "blowup"
    # As in the scalar case; brentq on lambda_min(P) is exact to 1e-15.
    np.testing.assert_allclose(float(sol.blowup_time), t_star, rtol=1e-8)


def test_library_closed_form_isotropic_rotating_ffn():
    # W = w I + K, K skew commuting with M and Sigma0 (d = 2: M, Sigma0 multiples
    # of I): P(t) = e^{-2wt} (P0 - phi(t) M), phi = (e^{2wt} - 1) / (2w).
    w, k, a = 0.3, 0.8, 0.6
    W = w * np.eye(2) + k * np.array([[0.0, 1.0], [-1.0, 0.0]])
    A = a * np.eye(2) + 0.5 * np.array([[0.0, 1.0], [-1.0, 0.0]])  # M = 2a I
    g = mf.Gaussian(jnp.zeros(2), 0.8 * jnp.eye(2))
    attn = mf.SoftmaxAttention(jnp.eye(2), A=jnp.asarray(A))
    ffn = mf.FeedForward(jnp.asarray(W))
    tau = 1 / (0.8 * 2 * a)
    t_star = np.log1p(2 * w * tau) / (2 * w)
    np.testing.assert_allclose(mf.gaussian.blowup_time(g, attn, ffn=ffn), t_star)
    ts = np.linspace(0, 0.9 * t_star, 5)
    cf = mf.gaussian.closed_form(g, attn, ts, ffn=ffn)
    sol = mf.gaussian.simulate(g, attn, 3.0, ffn=ffn, saveat=ts, **TIGHT)
    np.testing.assert_allclose(sol.cov, cf.cov, rtol=1e-9, atol=1e-12)
    np.testing.assert_allclose(cf.mean, 0.0)  # alpha0 = 0 and b_f = 0
    np.testing.assert_allclose(float(sol.blowup_time), t_star, rtol=1e-8)
    # The same through a block.
    block = mf.Block(attn, ffn)
    assert mf.gaussian.blowup_time(g, block) == mf.gaussian.blowup_time(
        g, attn, ffn=ffn
    )
    # Outside the case (K not commuting with M): refused, not wrong.
    A_bad = np.array([[1.0, 0.2], [0.0, 0.3]])
    with pytest.raises(ValueError, match="w I \\+ K"):
        mf.gaussian.blowup_time(
            g, mf.SoftmaxAttention(jnp.eye(2), A=jnp.asarray(A_bad)), ffn=ffn
        )


# ------------------------------------------------ other families, against SciPy


def _multihead_parts(d=2, seed=1):
    rng = np.random.default_rng(seed)
    V1, A1 = np.eye(d) + 0.2 * rng.normal(size=(d, d)), 0.3 * rng.normal(size=(d, d))
    V2, Q2, K2 = np.eye(d), 0.5 * rng.normal(size=(d, d)), np.eye(d)
    O1, O2 = np.eye(d), 0.5 * np.eye(d) + 0.1 * rng.normal(size=(d, d))
    attn = mf.MultiHeadAttention(
        [
            mf.SoftmaxAttention(jnp.asarray(V1), A=jnp.asarray(A1)),
            mf.L2Attention(jnp.asarray(V2), Q=jnp.asarray(Q2), K=jnp.asarray(K2)),
        ],
        out=[jnp.asarray(O1), jnp.asarray(O2)],
    )

    def field(al, S, t):
        B1, b1 = _softmax_np(al, S, t, V1, A1)
        B2, b2 = _l2_np(al, S, t, V2, Q2, K2)
        return O1 @ B1 + O2 @ B2, O1 @ b1 + O2 @ b2

    return attn, field


def _l2_parts(d=2, seed=2):
    rng = np.random.default_rng(seed)
    V, Q, K = (
        np.eye(d) + 0.3 * rng.normal(size=(d, d)),
        rng.normal(size=(d, d)),
        np.eye(d),
    )
    attn = mf.L2Attention(jnp.asarray(V), Q=jnp.asarray(Q), K=jnp.asarray(K))
    return attn, lambda al, S, t: _l2_np(al, S, t, V, Q, K)


@pytest.mark.parametrize(
    "parts", [_l2_parts, _multihead_parts], ids=["l2", "multihead"]
)
@pytest.mark.parametrize("time_dependent", [False, True], ids=["const", "W(t)"])
def test_moment_ode_against_scipy(parts, time_dependent):
    attn, field = parts()
    W0 = np.array([[-0.3, 0.4], [-0.1, 0.2]])
    b0 = np.array([0.5, -0.2])
    if time_dependent:  # W(t) = W0 cos t, b(t) = b0 t: plain functions of t
        W_of = lambda t: W0 * np.cos(t)  # noqa: E731
        b_of = lambda t: b0 * t  # noqa: E731
        ffn = mf.FeedForward(lambda t: jnp.asarray(W0) * jnp.cos(t), lambda t: b0 * t)
    else:
        W_of, b_of = (lambda t: W0), (lambda t: b0)
        ffn = mf.FeedForward(jnp.asarray(W0), jnp.asarray(b0))
    alpha0, S0 = np.array([0.4, -0.2]), np.array([[1.0, 0.3], [0.3, 0.6]])
    ts = np.linspace(0, 1.0, 6)
    sol = mf.gaussian.simulate(
        mf.Gaussian(alpha0, S0), attn, 1.0, ffn=ffn, saveat=ts, **TIGHT
    )
    mean, cov = _moments_ivp(field, W_of, b_of, alpha0, S0, ts)
    assert sol.status == "success"
    # Both solvers at rtol 1e-12 (DOP853 / Dopri8) on O(1) moments: 1e-9.
    np.testing.assert_allclose(sol.mean, mean, rtol=1e-9, atol=1e-10)
    np.testing.assert_allclose(sol.cov, cov, rtol=1e-9, atol=1e-10)


def test_block_and_ffn_are_the_same_field():
    A, W, b, S0, alpha0 = _example(d=2)
    g = mf.Gaussian(alpha0, S0)
    attn = mf.SinkhornAttention(jnp.eye(2), A=jnp.asarray(A))
    ffn = mf.FeedForward(jnp.asarray(W), jnp.asarray(b))
    B0, b0 = mf.gaussian.velocity(g, attn)
    B1, b1 = mf.gaussian.velocity(g, attn, ffn=ffn)
    np.testing.assert_allclose(B1, B0 + W, rtol=1e-14)
    np.testing.assert_allclose(b1, b0 + b, rtol=1e-14)
    B2, b2 = mf.gaussian.velocity(g, mf.Block(attn, ffn))
    np.testing.assert_array_equal(B1, B2)
    np.testing.assert_array_equal(b1, b2)
    ts = jnp.linspace(0, 1, 3)
    s1 = mf.gaussian.simulate(g, attn, 1.0, ffn=ffn, saveat=ts)
    s2 = mf.gaussian.simulate(g, mf.Block(attn, ffn), 1.0, saveat=ts)
    np.testing.assert_array_equal(s1.cov, s2.cov)
    np.testing.assert_array_equal(s1.mean, s2.mean)


def test_simulate_with_ffn_under_jit():
    A, W, b, S0, alpha0 = _example(d=2)
    g = mf.Gaussian(alpha0, S0)
    attn = mf.SoftmaxAttention(jnp.eye(2), A=jnp.asarray(A))

    @jax.jit
    def final_trace(W):
        sol = mf.gaussian.simulate(g, attn, 0.2, ffn=mf.FeedForward(W, jnp.asarray(b)))
        return jnp.trace(sol.cov[-1])

    eager = mf.gaussian.simulate(g, attn, 0.2, ffn=mf.FeedForward(jnp.asarray(W)))
    np.testing.assert_allclose(final_trace(jnp.asarray(W)), jnp.trace(eager.cov[-1]))


# ------------------------------------------------------------------ validation


def _mlp(d):
    return mf.MLP(jnp.ones((3, d)), None, jnp.ones((d, 3)))


def test_non_affine_feedforward_is_refused():
    g = mf.Gaussian(jnp.zeros(2), jnp.eye(2))
    attn = mf.SoftmaxAttention(jnp.eye(2), A=jnp.eye(2))
    ffn = mf.FeedForward(0.1 * jnp.eye(2))
    for call in (
        lambda f: mf.gaussian.simulate(g, attn, 1.0, ffn=f),
        lambda f: mf.gaussian.velocity(g, attn, ffn=f),
        lambda f: mf.gaussian.blowup_time(g, attn, ffn=f),
        lambda f: mf.gaussian.closed_form(g, attn, [0.0], ffn=f),
        lambda f: mf.gaussian.blowup_times(g, attn, 1.0, ffn=f),
        lambda f: mf.gaussian.compare_particles(
            g, attn, 8, [0.0, 0.1], jr.key(0), ffn=f
        ),
    ):
        with pytest.raises(ValueError, match="`ffn`.*got MLP.*not affine"):
            call(_mlp(2))
        with pytest.raises(ValueError, match="`ffn` must be None or an affine"):
            call(0.1 * jnp.eye(2))
    for call in (
        lambda a: mf.gaussian.simulate(g, a, 1.0),
        lambda a: mf.gaussian.velocity(g, a),
        lambda a: mf.gaussian.blowup_time(g, a),
        lambda a: mf.gaussian.blowup_times(g, a, 1.0),
    ):
        with pytest.raises(ValueError, match="MLP.*not affine"):
            call(mf.Block(attn, _mlp(2)))
    with pytest.raises(ValueError, match="`ffn` given twice"):
        mf.gaussian.blowup_time(g, mf.Block(attn, ffn), ffn=ffn)
    with pytest.raises(ValueError, match="W"):  # W of the wrong size for d = 2
        mf.gaussian.simulate(g, attn, 1.0, ffn=mf.FeedForward(jnp.eye(3)))
    with pytest.raises(ValueError, match="constant"):
        mf.gaussian.blowup_time(g, attn, ffn=mf.FeedForward(lambda t: t * jnp.eye(2)))


# ------------------------------------------------------- the batched study


def _study_batch(n, d=2, seed=3):
    As = jr.normal(jr.key(seed), (n, d, d)) / np.sqrt(d)
    attns = jax.vmap(lambda A: mf.SoftmaxAttention(jnp.eye(d), A=A))(As)
    tau = 1 / np.linalg.eigvalsh(np.asarray(As + jnp.swapaxes(As, 1, 2)))[:, -1]
    return attns, np.where(tau > 0, tau, np.inf)


def _isotropic_t_star(tau, w, t_max):
    grow = 1 + 2 * w * tau
    with np.errstate(invalid="ignore", divide="ignore"):
        t = np.where(grow > 0, np.log(np.where(grow > 0, grow, 1)) / (2 * w), np.inf)
    return np.where(t <= t_max, t, np.inf)


def test_blowup_times_with_ffn_match_closed_form():
    # V = I, Sigma0 = I, W = w I: t* = log(1 + 2 w tau) / (2w), tau = 1/lambda_max(M).
    n, d, t_max = 200, 2, 5.0
    attns, tau = _study_batch(n)
    g = mf.Gaussian(jnp.zeros(d), jnp.eye(d))
    ws = np.where(np.arange(n) % 2 == 0, 0.3, -0.4)
    shared = mf.FeedForward(0.3 * jnp.eye(d), jnp.ones(d))  # b_f: no effect on Sigma
    batched = jax.vmap(lambda w: mf.FeedForward(w * jnp.eye(d), jnp.ones(d)))(
        jnp.asarray(ws)
    )
    study = mf.gaussian.blowup_times(g, {"shared": attns}, t_max, ffn=shared)
    blocks = {"blocks": mf.Block(attns, batched)}
    study_b = mf.gaussian.blowup_times(g, blocks, t_max)
    for got, w in ((study.times["shared"], 0.3), (study_b.times["blocks"], ws)):
        want = _isotropic_t_star(tau, w, t_max)
        fin = np.isfinite(want)
        assert 10 < fin.sum() < n
        np.testing.assert_array_equal(np.isfinite(got), fin)
        # The study's tolerance is rtol 1e-8 on the scale-shape state; its blow-up
        # times are good to ~1e-8 (docs/how-to/blowup.md checks 1e-6): 1e-6.
        np.testing.assert_allclose(got[fin], want[fin], rtol=1e-6)
    # ffn= and a block of the same pieces give the same study.
    same = mf.gaussian.blowup_times(g, {"b": mf.Block(attns, shared)}, t_max)
    np.testing.assert_array_equal(same.times["b"], study.times["shared"])
    with pytest.raises(ValueError, match="same batch size"):
        mf.gaussian.blowup_times(
            g, mf.Block(attns, jax.tree.map(lambda a: a[:3], batched)), t_max
        )


def test_softmax_with_ffn_keeps_scale_shape_path():
    ffn = mf.FeedForward(0.3 * jnp.eye(2))
    soft = mf.SoftmaxAttention(jnp.eye(2), A=jnp.eye(2))
    l2 = mf.L2Attention(jnp.eye(2), Q=jnp.eye(2), K=jnp.eye(2))
    assert not _needs_frame(mf.Block(soft, ffn), 0.0, 2)
    assert _needs_frame(mf.Block(l2, ffn), 0.0, 2)


@pytest.mark.slow
def test_blowup_times_frame_path_with_ffn_matches_simulate():
    # L2 with a rank-deficient head (K = [1 0]) goes through the frame coordinates;
    # with W the study must agree with `simulate` run by run.
    rng = np.random.default_rng(4)
    n, t_max = 6, 4.0
    Qs = jnp.asarray(rng.normal(size=(n, 1, 2)))
    K, V = jnp.array([[1.0, 0.0]]), jnp.eye(2)
    attns = jax.vmap(lambda Q: mf.L2Attention(V, Q=Q, K=K))(Qs)
    ffn = mf.FeedForward(jnp.array([[0.2, 0.3], [-0.3, 0.1]]))
    g = mf.Gaussian(jnp.zeros(2), jnp.array([[1.0, 0.4], [0.4, 0.7]]))
    study = mf.gaussian.blowup_times(g, {"l2": attns}, t_max, ffn=ffn)
    for i in range(n):
        attn = mf.L2Attention(V, Q=Qs[i], K=K)
        sol = mf.gaussian.simulate(g, attn, t_max, ffn=ffn, **TIGHT)
        got = study.times["l2"][i]
        if sol.status == "blowup":
            # simulate extrapolates to 1e-8; the study holds rtol 1e-8: 1e-5.
            np.testing.assert_allclose(got, float(sol.blowup_time), rtol=1e-5)
        else:
            assert np.isinf(got)
            assert study.status_names("l2")[i] in ("success", "stationary")


# ------------------------------------------------- particles follow the flow


# Moderate A and Sigma0: the particle field is a self-normalised importance
# average with weights e^{<A x, y>}, whose variance is finite (and the rate
# n^{-1/2}) only while 2 Sigma^{1/2} A^T Sigma A Sigma^{1/2} < I along the run.
ALPHA0 = np.array([0.4, -0.2])
SIGMA0 = 0.5 * np.array([[1.0, 0.3], [0.3, 0.6]])
A_PART = np.array([[0.3, 0.1], [-0.1, 0.2]])
W_PART, B_PART = np.array([[-0.2, 0.5], [-0.4, 0.1]]), np.array([0.3, -0.1])


def _coupling_distances(ns, seeds, t1=1.0):
    """Per n, the mean over seeds of the coupling distance at t1.

    sqrt(mean_i |x_i(t1) - (alpha(t1) + Phi(t1)(x_i(0) - alpha0))|^2), an upper
    bound of W2 between the particle system and the samples pushed by the
    Gaussian flow. The n samples are the first n of max(ns), with weight 1/n and
    the rest weight 0 (they move with the field and do not act on it): one
    compilation for every n.
    """
    N = max(ns)
    mean, _, Phi = _moments_ivp(
        lambda al, S, t: _softmax_np(al, S, t, np.eye(2), A_PART),
        lambda t: W_PART,
        lambda t: B_PART,
        ALPHA0,
        SIGMA0,
        np.array([0.0, t1]),
        with_phi=True,
    )
    block = mf.Block(
        mf.SoftmaxAttention(jnp.eye(2), A=jnp.asarray(A_PART)),
        mf.FeedForward(jnp.asarray(W_PART), jnp.asarray(B_PART)),
    )
    chol = np.linalg.cholesky(SIGMA0)
    out = []
    for n in ns:
        dists = []
        for seed in seeds:
            x0 = ALPHA0 + np.random.default_rng(seed).normal(size=(N, 2)) @ chol.T
            w = np.where(np.arange(N) < n, 1.0 / n, 0.0)
            mu = mf.Particles(jnp.asarray(x0), jnp.asarray(w))
            # rtol 1e-5: the solver's error is far below the Monte Carlo ~1e-2.
            sol = mf.simulate(mu, block, t1, rtol=1e-5, atol=1e-5)
            xT = np.asarray(sol.x[-1])[:n]
            pred = mean[-1] + (x0[:n] - ALPHA0) @ Phi[-1].T
            dists.append(np.sqrt(np.mean(np.sum((xT - pred) ** 2, axis=1))))
        out.append(np.mean(dists))
    return np.array(out)


@pytest.mark.slow
def test_particles_follow_the_gaussian_flow():
    # The mean-field flow of a Gaussian is affine, X(t) = alpha + Phi (X0 - alpha0),
    # Phi' = (B + W) Phi; n particles sampled from the Gaussian feel the field of
    # their empirical measure, off by O(n^{-1/2}) (Monte Carlo), so the coupling
    # distance falls like n^{-1/2}. One seed's distance spreads by ~50 %; over
    # n = 64 ... 2048 and 8 seeds the fitted slope carries ~0.06 of noise (2 sigma:
    # +- 0.12).
    ns = [64, 128, 256, 512, 1024, 2048]
    errs = _coupling_distances(ns, seeds=range(8))
    slope = np.polyfit(np.log(ns), np.log(errs), 1)[0]
    assert -0.62 < slope < -0.38, (slope, errs)


# ------------------------------------------------------------- rank of Sigma


@pytest.mark.parametrize(
    "eps, tol",
    # lambda_min is a cancellation of O(1) entries: Dopri8's error at rtol 1e-14,
    # ~1e-14 per step on O(1) entries and accumulated over the steps, is ~1e-6 of
    # an eigenvalue 1e-8 (tolerance 1e-4) and ~10 % of one ~1e-13 (measured 11 %;
    # tolerance 25 %, still far inside the factor ~9 by which it moves).
    [(1e-8, 1e-4), (1e-12, 0.25)],
    ids=["1e-8", "1e-12"],
)
def test_nearly_singular_direction_is_transported(eps, tol):
    # Sigma(t) = Phi Sigma0 Phi^T with Phi' = (B + W) Phi invertible: the rank of
    # Sigma never changes. mf.Gaussian needs cov positive definite, so a rank-1
    # Sigma0 is taken as eigenvalues (1, eps). In d = 2,
    # lambda_min(t) = det Sigma0 det(Phi)^2 / lambda_max(t): the small direction
    # neither collapses to 0 nor jumps, it scales with det(Phi)^2.
    R = _rotation(0.6)
    S0 = R @ np.diag([1.0, eps]) @ R.T
    alpha0 = np.array([0.1, 0.2])
    A = np.array([[0.5, 0.3], [-0.2, 0.4]])
    W, b = np.array([[0.3, -0.6], [0.2, -1.5]]), np.array([0.1, 0.0])
    attn = mf.SoftmaxAttention(jnp.eye(2), A=jnp.asarray(A))
    ts = np.linspace(0, 1.0, 5)
    # atol far below eps: the small eigenvalue sits in Sigma's last digits.
    sol = mf.gaussian.simulate(
        mf.Gaussian(alpha0, S0),
        attn,
        1.0,
        ffn=mf.FeedForward(jnp.asarray(W), jnp.asarray(b)),
        saveat=ts,
        rtol=1e-14,
        atol=1e-20,
    )
    _, cov, Phi = _moments_ivp(
        lambda al, S, t: _softmax_np(al, S, t, np.eye(2), A),
        lambda t: W,
        lambda t: b,
        alpha0,
        S0,
        ts,
        with_phi=True,
    )
    lam = np.linalg.eigvalsh(np.asarray(sol.cov))
    lam_max = np.linalg.eigvalsh(cov)[:, -1]
    want_min = np.linalg.det(S0) * np.linalg.det(Phi) ** 2 / lam_max
    # The closed form moves lambda_min by a factor far from 1 (else the test
    # could not tell transport from "frozen").
    assert np.max(want_min) / np.min(want_min) > 5
    np.testing.assert_allclose(lam[:, -1], lam_max, rtol=1e-10)
    np.testing.assert_allclose(lam[:, 0], want_min, rtol=tol)
    # Rank 1 to a relative 1e3 eps and rank 2 to 1e-3 eps, at every time.
    rank = jax.vmap(mf.gaussian.numerical_rank, in_axes=(0, None))
    np.testing.assert_array_equal(rank(sol.cov, 1e3 * eps), 1)
    np.testing.assert_array_equal(rank(sol.cov, 1e-3 * eps), 2)


@pytest.mark.parametrize("d", [1, 3])
def test_no_blowup_when_one_plus_two_w_t0_is_zero(d):
    # A = diag(0.7, 0.2, -0.5), Sigma0 = I / p0 with p0 = 2, W = w I with
    # w = -0.35: t0* = p0 / (2 * 0.7) and 1 + 2 w t0* = 0 exactly in binary
    # (0.35 = 0.7 / 2), so phi(t) < t0* at every t: no blow-up, although the
    # eigenvalue route evaluates 1 + 2 w t0* to ~1e-16, not 0.
    a = np.array([0.7, 0.2, -0.5])[:d]
    g = mf.Gaussian(np.zeros(d), np.eye(d) / 2)
    attn = mf.SoftmaxAttention(jnp.eye(d), A=jnp.diag(a))
    ffn = mf.FeedForward(-0.35 * jnp.eye(d))
    assert mf.gaussian.blowup_time(g, attn, ffn=ffn) == np.inf
    # The top direction keeps its variance 1/p0 (p = p0 is the unstable fixed
    # point -a/w of p' = -2a - 2wp); the others contract like e^{-2|w|t}.
    cov = mf.gaussian.closed_form(g, attn, [0.0, 2.0, 5.0], ffn=ffn).cov
    # Sigma = e^{2wt} (p0 - phi M)^{-1}: the cancellation in p0 - phi M costs a
    # factor e^{2|w|t} ~ 33 of rounding at t = 5 (7e-15; 9e-15 measured).
    np.testing.assert_allclose(cov[:, 0, 0], 0.5, rtol=1e-13)
    # A little less contraction, far beyond rounding, blows up at
    # log(1 + 2 w t0*) / (2 w) with 1 + 2 w t0* = 1e-9.
    w = -0.35 * (1 - 1e-9)
    got = mf.gaussian.blowup_time(g, attn, ffn=mf.FeedForward(w * jnp.eye(d)))
    # 1 + 2 w t0* = 1e-9 is known to the rounding bound blowup_time uses, 4 d eps
    # (1 + spread) |2 w t0*| = 5e-15 at d = 3: 5e-6 relatively. The log, ~20.7,
    # to 5e-6 absolutely, 3e-7 relatively (4e-9 measured).
    np.testing.assert_allclose(got, np.log(1e-9) / (2 * w), rtol=3e-7)
