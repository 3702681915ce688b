"""Gaussian moment ODE (Castin, Ablin, Carrillo & Peyre, 2025).

Derivations: docs/math/gaussians.md.
"""

import jax
import jax.numpy as jnp
import jax.random as jr
import numpy as np
import pytest

import meanfield as mf

SIGMA0 = np.array([[1.0, 0.3], [0.3, 0.6]])
ALPHA0 = np.array([0.4, -0.2])


def _random(key, d, scale):
    ka, kv, kq, kk = jr.split(key, 4)
    A = scale * np.asarray(jr.normal(ka, (d, d)))
    V = np.asarray(jr.normal(kv, (d, d))) / np.sqrt(d)
    Q = scale * np.asarray(jr.normal(kq, (d, d)))
    K = np.asarray(jr.normal(kk, (d, d)))
    return A, V, Q, K


def _mc_error(attn, gauss, n, key, z):
    B, b = mf.gaussian.velocity(gauss, attn)
    mu = gauss.sample(key, n)
    got = attn.velocity_at(mu, z)
    return float(np.max(np.abs(got - (z @ np.asarray(B).T + np.asarray(b)))))


def _mc_slope(attn, gauss, ns, key, seeds, z_key):
    """Mean over seeds of the field error for each n, and its log-log slope."""
    z = np.asarray(jr.normal(z_key, (6, gauss.dim)))
    errs = [
        np.mean(
            [
                _mc_error(attn, gauss, int(n), k, z)
                for k in jr.split(jr.fold_in(key, i), seeds)
            ]
        )
        for i, n in enumerate(ns)
    ]
    return np.polyfit(np.log(ns), np.log(errs), 1)[0], errs


@pytest.mark.parametrize(
    "family", ["softmax", pytest.param("l2", marks=pytest.mark.slow)]
)
def test_affine_field_matches_monte_carlo_at_rate_one_over_sqrt_n(key, family):
    d = 2
    A, V, Q, K = _random(jr.key(1), d, 0.4)
    gauss = mf.Gaussian(ALPHA0, SIGMA0)
    attn = (
        mf.SoftmaxAttention(V, A=A)
        if family == "softmax"
        else mf.L2Attention(V, Q=Q, K=K)
    )
    ns = np.array([10_000, 100_000, 1_000_000])
    slope, errs = _mc_slope(attn, gauss, ns, key, seeds=6, z_key=jr.key(2))
    # Monte Carlo error ~ C n^{-1/2}; the mean over 6 seeds leaves ~ +-0.15 of noise.
    assert -0.7 < slope < -0.3, (slope, errs)
    assert errs[-1] < 1e-2


# Second tier (make test-slow): Sinkhorn on up to 8000 samples, 111 s on 2 cores.
@pytest.mark.slow
def test_sinkhorn_affine_field_matches_discrete_sinkhorn_on_samples(key):
    d = 2
    A, V, _, _ = _random(jr.key(3), d, 0.5)
    gauss = mf.Gaussian(ALPHA0, SIGMA0)
    attn = mf.SinkhornAttention(V, A=A, tol=1e-10)
    ns = np.array([500, 2000, 8000])
    slope, errs = _mc_slope(attn, gauss, ns, key, seeds=3, z_key=jr.key(4))
    # The discrete entropic coupling of n samples converges at the rate n^{-1/2}.
    assert -0.8 < slope < -0.3, (slope, errs)
    assert errs[-1] < 0.05


def test_sinkhorn_kernel_l2_is_dot_with_2A():
    A, V, Q, K = _random(jr.key(5), 3, 0.5)
    gauss = mf.Gaussian(np.zeros(3), np.eye(3))
    got = mf.gaussian.velocity(gauss, mf.SinkhornAttention(V, Q=Q, K=K, kernel="l2"))
    want = mf.gaussian.velocity(gauss, mf.SinkhornAttention(V, A=2 * K.T @ Q))
    np.testing.assert_allclose(got[0], want[0], rtol=1e-12, atol=1e-12)


def test_sinkhorn_small_A_is_softmax_covariance_to_first_order():
    # S = Sigma A^T Sigma + O(|A|^3): B = V S^T Sigma^{-1} = V Sigma A Sigma Sigma^{-1}.
    _, V, _, _ = _random(jr.key(6), 2, 1.0)
    A = 1e-4 * np.array([[1.0, 2.0], [-0.5, 0.3]])
    gauss = mf.Gaussian(ALPHA0, SIGMA0)
    B_sk, _ = mf.gaussian.velocity(gauss, mf.SinkhornAttention(V, A=A))
    B_soft, _ = mf.gaussian.velocity(gauss, mf.SoftmaxAttention(V, A=A))
    np.testing.assert_allclose(B_sk, B_soft, rtol=0, atol=1e-11)


def test_multihead_sums_heads_and_time_dependence():
    A, V, Q, K = _random(jr.key(7), 2, 0.5)
    gauss = mf.Gaussian(ALPHA0, SIGMA0)
    W = np.array([[0.0, 1.0], [1.0, 0.0]])
    h1, h2 = mf.SoftmaxAttention(V, A=A), mf.L2Attention(V, Q=Q, K=K)
    B, b = mf.gaussian.velocity(
        gauss, mf.MultiHeadAttention([h1, h2], out=[np.eye(2), W])
    )
    B1, b1 = mf.gaussian.velocity(gauss, h1)
    B2, b2 = mf.gaussian.velocity(gauss, h2)
    np.testing.assert_allclose(B, B1 + W @ B2, rtol=1e-12)
    np.testing.assert_allclose(b, b1 + W @ b2, rtol=1e-12)
    tdep = mf.SoftmaxAttention(mf.PiecewiseConstant(np.stack([V, 2 * V]), t1=2.0), A=A)
    np.testing.assert_allclose(
        mf.gaussian.velocity(gauss, tdep, t=1.5)[0], 2 * B1, rtol=1e-12
    )


def _commuting_case():
    # V = I and diagonal A, Sigma0: every closed-form condition holds.
    A = np.diag([0.8, -0.5])
    return mf.Gaussian(ALPHA0, np.diag([1.0, 2.0])), mf.SoftmaxAttention(np.eye(2), A=A)


def test_moment_ode_matches_closed_form():
    gauss, attn = _commuting_case()
    t_star = mf.gaussian.blowup_time(gauss, attn)
    ts = np.linspace(0, 0.9 * t_star, 7)
    sol = mf.gaussian.simulate(gauss, attn, ts[-1], saveat=ts, rtol=1e-12, atol=1e-12)
    cf = mf.gaussian.closed_form(gauss, attn, ts)
    # Sigma grows 10x by 0.9 t*; an 8th-order solve at 1e-12 keeps ~1e-10 relative.
    scale = np.abs(cf.cov).max(axis=(1, 2))[:, None, None]
    assert np.max(np.abs(sol.cov - cf.cov) / scale) < 1e-8
    assert np.max(np.abs(sol.mean - cf.mean) / np.abs(cf.mean).max()) < 1e-8


def test_tolerances_do_not_recompile_the_moment_ode():
    gauss, attn = _commuting_case()
    t = 0.5 * mf.gaussian.blowup_time(gauss, attn)
    events = []

    def listener(event, duration, **kwargs):
        if event == "/jax/core/compile/backend_compile_duration":
            events.append(duration)

    loose = mf.gaussian.simulate(gauss, attn, t, rtol=1e-4, atol=1e-4)
    jax.monitoring.register_event_duration_secs_listener(listener)
    try:
        tight = mf.gaussian.simulate(gauss, attn, t, rtol=1e-12, atol=1e-12)
        tight.cov.block_until_ready()
    finally:
        jax.monitoring.unregister_event_duration_listener(listener)
    assert events == []
    # The tolerances reached the solver: the loose run takes fewer steps.
    assert int(loose.num_steps) < int(tight.num_steps)


def test_closed_form_for_non_symmetric_commuting_case_and_global_solutions():
    # M = A + A^T negative definite: global, Sigma(t) -> 0 at rate 1/t.
    A = np.array([[-1.0, 2.0], [-2.0, -1.0]])
    gauss = mf.Gaussian(np.zeros(2), np.eye(2))
    attn = mf.SoftmaxAttention(np.eye(2), A=A)
    assert mf.gaussian.blowup_time(gauss, attn) == np.inf
    ts = np.array([0.0, 1.0, 10.0])
    cf = mf.gaussian.closed_form(gauss, attn, ts)
    np.testing.assert_allclose(cf.cov[-1], np.eye(2) / 21, rtol=1e-12)
    sol = mf.gaussian.simulate(gauss, attn, 10.0, saveat=ts, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(sol.cov, cf.cov, rtol=1e-8, atol=1e-12)


def test_detected_blowup_time_matches_analytic_time():
    gauss, attn = _commuting_case()
    t_star = mf.gaussian.blowup_time(gauss, attn)
    np.testing.assert_allclose(t_star, 1 / (2 * 0.8 * 1.0))
    sol = mf.gaussian.simulate(gauss, attn, 3 * t_star)
    assert sol.status == "blowup"
    np.testing.assert_allclose(float(sol.blowup_time), t_star, rtol=1e-4)
    # saveat=None: the last row is the state where the solve stopped, labelled
    # with that time (it once carried t1 = 3 t*).
    assert float(sol.ts[-1]) == float(sol.t_final) < t_star


def test_l2_full_rank_K_does_not_blow_up_where_softmax_does():
    Q = np.array([[1.0, 0.5], [0.0, 1.0]])
    K = np.array([[1.0, 0.0], [0.3, 1.0]])
    V = np.eye(2)
    gauss = mf.Gaussian(np.zeros(2), SIGMA0)
    softmax = mf.gaussian.simulate(gauss, mf.SoftmaxAttention(V, Q=Q, K=K), 50.0)
    assert softmax.status == "blowup"
    t_star = float(softmax.blowup_time)
    ts = np.linspace(0, 10 * t_star, 11)
    l2 = mf.gaussian.simulate(
        gauss, mf.L2Attention(V, Q=Q, K=K), 10 * t_star, saveat=ts
    )
    assert l2.status == "success"
    # |B| <= |V| |Q| / s_min(K) (docs/math/gaussians.md), so
    # |Sigma(t)| <= |Sigma0| e^{2 t |V| |Q| / s_min(K)}.
    rate = np.linalg.norm(V, 2) * np.linalg.norm(Q, 2) / np.linalg.svd(K)[1][-1]
    bound = np.linalg.norm(SIGMA0, 2) * np.exp(2 * rate * ts)
    assert np.all(
        np.linalg.norm(np.asarray(l2.cov), 2, axis=(1, 2)) <= bound * (1 + 1e-8)
    )


def test_l2_rank_deficient_K_blows_up_at_its_analytic_time():
    a, b0, c0 = 0.7, 0.4, 1.3
    gauss = mf.Gaussian(np.zeros(2), np.array([[a, b0], [b0, c0]]))
    attn = mf.L2Attention(
        np.array([[0.0, 0.0], [0.0, 1.0]]),
        Q=np.array([[0.0, 1.0]]),
        K=np.array([[1.0, 0.0]]),
    )
    t_star = (1 + 2 * a) / (2 * b0)
    ts = np.linspace(0, 0.9 * t_star, 4)
    sol = mf.gaussian.simulate(
        gauss, attn, 0.9 * t_star, saveat=ts, rtol=1e-12, atol=1e-12
    )
    s12 = b0 / (1 - 2 * b0 * ts / (1 + 2 * a))
    np.testing.assert_allclose(sol.cov[:, 0, 0], a, rtol=1e-9)
    np.testing.assert_allclose(sol.cov[:, 0, 1], s12, rtol=1e-8)
    np.testing.assert_allclose(sol.cov[:, 1, 1], c0 * (s12 / b0) ** 2, rtol=1e-8)
    sol = mf.gaussian.simulate(gauss, attn, 2 * t_star)
    assert sol.status == "blowup"
    np.testing.assert_allclose(float(sol.blowup_time), t_star, rtol=1e-4)


def test_sinkhorn_never_blows_up(key):
    gauss = mf.Gaussian(ALPHA0, SIGMA0)
    ts = np.linspace(0, 4, 9)
    for k in jr.split(key, 4):
        A, V, _, _ = _random(k, 2, 2.0)
        sol = mf.gaussian.simulate(gauss, mf.SinkhornAttention(V, A=A), 4.0, saveat=ts)
        assert sol.status == "success"
        # |S| <= |Sigma| gives |Sigma(t)| <= |Sigma0| e^{2 |V| t}.
        bound = np.linalg.norm(SIGMA0, 2) * np.exp(2 * np.linalg.norm(V, 2) * ts)
        assert np.all(
            np.linalg.norm(np.asarray(sol.cov), 2, axis=(1, 2)) <= bound * (1 + 1e-8)
        )


def test_blowup_study_over_a_batch(key):
    d, batch = 3, 64
    As = np.asarray(jr.normal(key, (batch, d, d))) / np.sqrt(d)
    Vs = np.broadcast_to(np.eye(d), (batch, d, d))
    gauss = mf.Gaussian(np.zeros(d), np.eye(d))
    make = lambda cls: jax.vmap(lambda A, V: cls(V, A=A))(As, Vs)
    study = mf.gaussian.blowup_times(
        gauss,
        {"softmax": make(mf.SoftmaxAttention), "sinkhorn": make(mf.SinkhornAttention)},
        3.0,
    )
    assert study.fraction["sinkhorn"] == 0.0
    # V = I: P = Sigma^{-1} = I - t (A + A^T) exactly, so t* = 1 / lambda_max(A + A^T).
    lam = np.linalg.eigvalsh(As + np.swapaxes(As, 1, 2))[:, -1]
    want = np.where(lam > 1 / 3.0, 1 / np.maximum(lam, 1e-300), np.inf)
    got = np.asarray(study.times["softmax"])
    finite = np.isfinite(want)
    np.testing.assert_array_equal(np.isfinite(got), finite)
    np.testing.assert_allclose(got[finite], want[finite], rtol=1e-4)
    assert study.fraction["softmax"] == pytest.approx(finite.mean())


def test_limit_rank_bound_for_symmetric_A(key):
    # V = I, A = -R R^T (rank r): M = 2A has inertia (0, r, d - r); the limit has
    # rank <= z + min(p, q) = d - r (docs/math/gaussians.md), attained.
    d, r, batch = 4, 2, 8
    R = np.asarray(jr.normal(key, (batch, d, r)))
    As = -np.einsum("bir,bjr->bij", R, R)
    gauss = mf.Gaussian(np.zeros(d), np.eye(d))
    attns = jax.vmap(lambda A: mf.SoftmaxAttention(jnp.eye(d), A=A))(As)
    study = mf.gaussian.blowup_times(gauss, attns, 1e5, rank_rtol=1e-3)
    ranks = np.asarray(study.rank["SoftmaxAttention"])
    assert np.all(ranks >= 0)
    for A, rank in zip(As, ranks, strict=True):
        lam = np.linalg.eigvalsh(2 * A)
        tol = 1e-9 * np.abs(lam).max()
        p, q = np.sum(lam > tol), np.sum(lam < -tol)
        z = d - p - q
        assert rank <= z + min(p, q)
    assert np.all(ranks == d - r)


# Second tier (make test-slow): particle solves at n = 1000 and 4000, 77 s.
@pytest.mark.slow
def test_particles_follow_the_moment_ode(key):
    A, V, _, _ = _random(jr.key(8), 2, 0.5)
    gauss = mf.Gaussian(ALPHA0, SIGMA0)
    attn = mf.SoftmaxAttention(V, A=A)
    ts = np.array([0.0, 0.5, 1.0])
    errs = {}
    for n in [1000, 4000]:
        runs = [
            mf.gaussian.compare_particles(gauss, attn, n, ts, k, dtype=jnp.float32)
            for k in jr.split(jr.fold_in(key, n), 4)
        ]
        errs[n] = np.sqrt(np.mean([np.asarray(r.cov_error[-1]) ** 2 for r in runs]))
        # The sample-mean error (amplified by the flow) scales like n^{-1/2}:
        # bound 0.1 at n = 4000, scaled (observed at most 0.16 at n = 1000).
        bound = 0.1 * np.sqrt(4000 / n)
        assert all(np.asarray(r.mean_error[-1]) < bound for r in runs)
    ratio = errs[1000] / errs[4000]
    # Monte Carlo: 4x the particles halves the error; RMS over 4 seeds, +-30%.
    assert 1.4 < ratio < 2.9, (ratio, errs)


@pytest.mark.parametrize(
    "call, match",
    [
        (
            lambda g: mf.Gaussian(np.zeros(2), np.array([[1.0, 2.0], [2.0, 1.0]])),
            "positive definite",
        ),
        (
            lambda g: mf.gaussian.simulate(
                g, mf.SoftmaxAttention(np.eye(3), A=np.eye(3)), 1.0
            ),
            r"`V` must have shape \(2, 2\)",
        ),
        (
            lambda g: mf.gaussian.simulate(
                g, mf.UnnormalizedAttention(np.eye(2), A=np.eye(2)), 1.0
            ),
            "not supported on Gaussians",
        ),
        (
            lambda g: mf.gaussian.velocity(
                g, mf.MultiHeadAttention([mf.ReLUAttention(np.eye(2), A=np.eye(2))])
            ),
            "not supported on Gaussians",
        ),
        (
            lambda g: mf.gaussian.closed_form(
                g,
                mf.SoftmaxAttention(np.array([[1.0, 1.0], [0.0, 1.0]]), A=np.eye(2)),
                [0.0],
            ),
            "closed form needs V to commute",
        ),
        (
            lambda g: mf.gaussian.blowup_time(
                g, mf.L2Attention(np.eye(2), Q=np.eye(2), K=np.eye(2))
            ),
            "closed form covers softmax attention only",
        ),
        (
            lambda g: mf.gaussian.velocity(
                mf.Particles(np.zeros((2, 2))),
                mf.SoftmaxAttention(np.eye(2), A=np.eye(2)),
            ),
            "must be a `Gaussian`",
        ),
        *[
            (
                lambda g, kw=kw: mf.gaussian.simulate(
                    g, mf.SoftmaxAttention(np.eye(2), A=np.eye(2)), **kw
                ),
                match,
            )
            for kw, match in (
                (dict(t1=np.inf), "`t1` must be a finite time"),
                (dict(t1=1.0, t0=np.nan), "`t0` must be a finite time"),
                (dict(t1=1.0, rtol=-1.0), "`rtol` must be >= 0"),
                (dict(t1=1.0, rtol=0.0, atol=0.0), "must not both be 0"),
                (dict(t1=1.0, max_steps=0), "`max_steps` must be a positive integer"),
            )
        ],
    ],
)
def test_bad_input(call, match):
    with pytest.raises(ValueError, match=match):
        call(mf.Gaussian(np.zeros(2), np.array([[2.0, 0.5], [0.5, 1.0]])))


def test_float32_blowup_is_found_not_stalled():
    # Float32 cannot step within 1e-8 of t*: the solve stops at dt < 100 ulps and
    # extrapolates the 1/(t* - t) profile instead of spinning until max_steps.
    gauss, attn = _commuting_case()
    g32 = mf.Gaussian(np.float32(ALPHA0), np.diag([1.0, 2.0]).astype(np.float32))
    a32 = mf.SoftmaxAttention(
        np.eye(2, dtype=np.float32), A=np.diag([0.8, -0.5]).astype(np.float32)
    )
    with jax.enable_x64(False):
        sol = mf.gaussian.simulate(g32, a32, 2.0)
    assert sol.status == "blowup" and int(sol.num_steps) < 1000
    np.testing.assert_allclose(
        float(sol.blowup_time), mf.gaussian.blowup_time(gauss, attn), rtol=1e-5
    )


def test_blowup_time_does_not_depend_on_the_horizon():
    # The step floor is 100 ulps of the current t, not of t1: a horizon of 1e300
    # once forbade every step shorter than 1e286.
    gauss, attn = _commuting_case()
    want = mf.gaussian.blowup_time(gauss, attn)
    for t1 in (2.0, 1e6, 1e300):
        sol = mf.gaussian.simulate(gauss, attn, t1)
        assert sol.status == "blowup"
        np.testing.assert_allclose(float(sol.blowup_time), want, rtol=1e-6)


def test_fast_exponential_l2_growth_is_not_a_blowup():
    # K = I, Q = 3 I: B -> K^T Q = 3 I, so Sigma grows like e^{6t} (e^{30} by t = 5),
    # beyond 1e8 e^{2 |V| t}, yet L2 with full-rank K never blows up
    # (docs/math/gaussians.md).
    attn = mf.L2Attention(np.eye(2), Q=3 * np.eye(2), K=np.eye(2))
    sol = mf.gaussian.simulate(mf.Gaussian(np.zeros(2), np.eye(2)), attn, 5.0)
    assert sol.status == "success"
    assert np.linalg.norm(np.asarray(sol.cov[-1]), 2) > 1e8 * np.exp(2 * 5.0)


# 6 s on 2 cores (37 s when the study ran in float32): run with -m slow.
@pytest.mark.slow
def test_float32_study_has_no_false_sinkhorn_blowups():
    # Float32 Sinkhorn runs got too stiff for the dtype (the step size collapses
    # while lambda_max plateaus): 2 were false blow-ups, then ~150 ended "failed"
    # or "max_steps". The study computes in float64 whatever the default now.
    with jax.enable_x64(False):
        As = jax.random.normal(jax.random.key(1), (1000, 2, 2))  # 2 false before
        g = mf.Gaussian(jnp.array([0.5, 0.0]), jnp.array([[1.0, 0.3], [0.3, 0.5]]))
        attns = jax.vmap(lambda A: mf.SinkhornAttention(jnp.eye(2), A=A))(As)
        study = mf.gaussian.blowup_times(g, {"sinkhorn": attns}, 5.0)
    assert study.fraction["sinkhorn"] == 0.0
    assert study.classes("sinkhorn") == {"success": 1.0}


def test_two_by_two_sqrt_closed_form_matches_the_spectral_root():
    # `sym_sqrt` uses (S + sqrt(det S) I) / sqrt(tr S + 2 sqrt(det S)) for d = 2;
    # reference: U sqrt(Lambda) U^T from a known spectrum, including rank one and 0.
    from meanfield._linalg import sym_sqrt

    rng = np.random.default_rng(0)
    for k in range(300):
        U = np.linalg.qr(rng.normal(size=(2, 2)))[0]
        lam = np.abs(rng.normal(size=2)) * 10.0 ** rng.uniform(-12, 3, 2)
        lam[0] = 0.0 if k % 10 == 0 else lam[0]
        want = (U * np.sqrt(lam)) @ U.T
        got = np.asarray(sym_sqrt(jnp.asarray((U * lam) @ U.T)))
        # eigenvalues carry an absolute error eps |S|, so their roots sqrt(eps |S|)
        np.testing.assert_allclose(got, want, rtol=0, atol=3e-8 * np.linalg.norm(want))
    assert np.all(np.asarray(sym_sqrt(jnp.zeros((2, 2)))) == 0)


def test_two_by_two_closed_forms_match_lapack():
    # norm2 and inverse take closed forms for 2 x 2 matrices.
    from meanfield._attention.base import norm2
    from meanfield._linalg import inverse

    rng = np.random.default_rng(1)
    for _ in range(200):
        M = rng.normal(size=(2, 2)) * 10.0 ** rng.uniform(-3, 3)
        np.testing.assert_allclose(
            float(norm2(jnp.asarray(M))), np.linalg.norm(M, 2), rtol=1e-14
        )
        cond = np.linalg.cond(M)
        np.testing.assert_allclose(
            np.asarray(inverse(jnp.asarray(M))),
            np.linalg.inv(M),
            rtol=0,
            atol=1e-14 * cond * np.linalg.norm(np.linalg.inv(M)),
        )
