"""Wasserstein distances, the Bures closed form, the conditional distance (Castin et
al., 2025, Def. 4.1) and the stability estimate of Geshkovski et al. (2023)."""

import itertools

import jax.numpy as jnp
import jax.random as jr
import matplotlib
import numpy as np
import pytest
from helpers import requires
from scipy.integrate import quad
from scipy.optimize import linprog

import meanfield as mf
from meanfield import plotting
from meanfield._kernels import blocked as _blocked
from meanfield.wasserstein._stability import hardy_constant

matplotlib.use("Agg")
W = mf.wasserstein


# ---- references --------------------------------------------------------------------


def brute_force_uniform(x, y, p):
    """min over permutations of mean |x_i - y_s(i)|^p, then ^(1/p) (n <= 7)."""
    n = x.shape[0]
    return min(
        np.mean(np.linalg.norm(x - y[list(perm)], axis=1) ** p)
        for perm in itertools.permutations(range(n))
    ) ** (1 / p)


def linprog_wp(x, a, y, b, p):
    """W_p by a generic LP solver (HiGHS): independent of POT's network simplex."""
    n, m = len(a), len(b)
    cost = np.linalg.norm(x[:, None] - y[None], axis=-1) ** p
    rows = np.kron(np.eye(n), np.ones((1, m)))
    cols = np.kron(np.ones((1, n)), np.eye(m))
    res = linprog(
        cost.ravel(), A_eq=np.vstack([rows, cols]), b_eq=np.r_[a, b], method="highs"
    )
    return res.fun ** (1 / p)


def quantile_wp_1d(x, a, y, b, p):
    """1-D closed form: W_p^p = int_0^1 |F^-1(u) - G^-1(u)|^p du (sorted quantiles)."""
    ix, iy = np.argsort(x), np.argsort(y)
    x, a, y, b = x[ix], a[ix], y[iy], b[iy]
    u = np.union1d(np.cumsum(a), np.cumsum(b))
    u = np.clip(u, 0, 1)
    lo = np.r_[0.0, u[:-1]]
    mid = (lo + u) / 2  # quantile functions are constant on each piece
    qx = x[np.minimum(np.searchsorted(np.cumsum(a), mid), len(x) - 1)]
    qy = y[np.minimum(np.searchsorted(np.cumsum(b), mid), len(y) - 1)]
    return np.sum((u - lo) * np.abs(qx - qy) ** p) ** (1 / p)


def simplex(rng, n):
    w = rng.random(n) + 0.05
    return w / w.sum()


# ---- exact W_p -----------------------------------------------------------------------


@requires("ot")
@pytest.mark.parametrize("p", [1, 2, 3])
@pytest.mark.parametrize("n", [1, 4, 7])
def test_exact_matches_brute_force_over_permutations(p, n):
    rng = np.random.default_rng(n + 10 * p)
    x, y = rng.normal(size=(n, 3)), rng.normal(size=(n, 3)) + 0.5
    d = W.distance(mf.Particles(x), mf.Particles(y), p=p)
    assert d.method == "exact" and d.converged and d.iterations is None
    # Both are exact optima of the same finite problem: rounding only.
    np.testing.assert_allclose(float(d), brute_force_uniform(x, y, p), rtol=1e-12)


@requires("ot")
def test_exact_weighted_matches_duplicated_atoms():
    # nu has weights 2/6 on 3 atoms = 6 uniform atoms, each duplicated: the weighted
    # solver must equal the permutation brute force of the duplicated measure.
    rng = np.random.default_rng(1)
    x, y = rng.normal(size=(6, 2)), rng.normal(size=(3, 2))
    d = W.distance(mf.Particles(x), mf.Particles(y, np.full(3, 1 / 3)), p=2)
    ref = brute_force_uniform(x, np.repeat(y, 2, axis=0), 2)
    np.testing.assert_allclose(float(d), ref, rtol=1e-12)


@requires("ot")
@pytest.mark.parametrize("p", [1, 1.5, 2])
def test_exact_weighted_matches_linear_program(p):
    rng = np.random.default_rng(2)
    x, y = rng.normal(size=(9, 2)), rng.normal(size=(6, 2))
    a, b = simplex(rng, 9), simplex(rng, 6)
    d = W.distance(mf.Particles(x, a), mf.Particles(y, b), p=p)
    # HiGHS' default primal/dual feasibility tolerance is 1e-7.
    np.testing.assert_allclose(float(d), linprog_wp(x, a, y, b, p), rtol=1e-6)


@requires("ot")
@pytest.mark.parametrize("p", [1, 2, 3.5])
def test_exact_matches_1d_quantile_formula(p):
    rng = np.random.default_rng(3)
    x, y = rng.normal(size=40), 2 * rng.normal(size=25) + 1
    a, b = simplex(rng, 40), simplex(rng, 25)
    d = W.distance(mf.Particles(x[:, None], a), mf.Particles(y[:, None], b), p=p)
    # Both sides sum ~65 float64 terms of size O(1): 1e-12 relative.
    np.testing.assert_allclose(float(d), quantile_wp_1d(x, a, y, b, p), rtol=1e-12)


@requires("ot")
def test_samples_approach_bures():
    g1 = mf.Gaussian(jnp.array([0.0, 0.0]), jnp.array([[1.0, 0.3], [0.3, 0.5]]))
    g2 = mf.Gaussian(jnp.array([1.0, -0.5]), jnp.array([[0.4, -0.1], [-0.1, 1.5]]))
    exact = float(W.gaussian_w2(g1, g2))

    def mean_error(n, seeds=4):
        errs = []
        for s in range(seeds):
            k1, k2 = jr.split(jr.key(s))
            errs.append(float(W.distance(g1.sample(k1, n), g2.sample(k2, n))) - exact)
        return abs(np.mean(errs))

    # Empirical W2 in d = 2 fluctuates like n^{-1/2}: sd 0.016 measured at n = 1000
    # (mean of 4 seeds: sd 0.008), against W2 = 1.33.
    large = mean_error(1000)
    assert large < 0.04
    assert large < mean_error(32)


@requires("ot")
def test_exact_distance_is_a_metric_on_examples():
    rng = np.random.default_rng(4)
    mus = [mf.Particles(rng.normal(size=(5, 2)), simplex(rng, 5)) for _ in range(3)]
    d = {(i, j): float(W.distance(mus[i], mus[j])) for i in range(3) for j in range(3)}
    for i in range(3):
        assert d[i, i] == pytest.approx(0, abs=1e-12)
        for j in range(3):
            assert d[i, j] == pytest.approx(d[j, i], rel=1e-12)
            for k in range(3):
                assert d[i, k] <= d[i, j] + d[j, k] + 1e-12


# ---- Sinkhorn ----------------------------------------------------------------------


def test_blocked_logsumexp_matches_dense():
    rng = np.random.default_rng(5)
    q, k = jnp.asarray(rng.normal(size=(37, 3))), jnp.asarray(rng.normal(size=(53, 3)))
    bias = jnp.asarray(rng.normal(size=53)).at[::7].set(-jnp.inf)  # zero weights
    dense = jnp.log(jnp.sum(jnp.exp(q @ k.T + bias[None, :]), axis=1))
    # Blocks that do not divide n or m: padding must not leak in.
    out = _blocked.logsumexp(lambda a, b: a @ b.T, q, k, bias, block_q=8, block_k=10)
    np.testing.assert_allclose(out, dense, rtol=1e-13)


@requires("ott")
def test_sinkhorn_ott_and_blocked_agree():
    rng = np.random.default_rng(6)
    x, y = rng.normal(size=(120, 2)), 0.8 * rng.normal(size=(90, 2)) + 0.5
    mu, nu = mf.Particles(x, simplex(rng, 120)), mf.Particles(y)
    dense = W.distance(mu, nu, method="sinkhorn", blocked=False, tol=1e-5)
    blocked = W.distance(mu, nu, method="sinkhorn", blocked=True, tol=1e-5)
    assert dense.converged and blocked.converged
    assert dense.epsilon == blocked.epsilon
    # Same fixed point, two solvers: a marginal error 1e-5 moved OT_eps by 2e-7
    # relative (measured, n = 300); S combines three such values.
    np.testing.assert_allclose(float(dense), float(blocked), rtol=1e-5)


@requires("ot", "ott")
@pytest.mark.parametrize("blocked", [False, True])
def test_sinkhorn_divergence_approaches_exact_as_epsilon_shrinks(blocked):
    rng = np.random.default_rng(7)
    x, y = rng.normal(size=(150, 2)), 0.8 * rng.normal(size=(150, 2)) + 0.5
    mu, nu = mf.Particles(x), mf.Particles(y)
    exact = float(W.distance(mu, nu))
    default = W.distance(mu, nu, method="sinkhorn", blocked=blocked)
    scale = default.epsilon / 1e-2  # default eps = 1e-2 s^p
    errors = [
        abs(float(W.distance(mu, nu, method="sinkhorn", epsilon=e * scale)) - exact)
        for e in (0.3, 0.1, 0.03)
    ]
    assert errors[0] > errors[1] > errors[2]
    # Measured: 0.7% below exact at the default eps for n = 300 (see docstring).
    assert abs(float(default) - exact) < 0.02 * exact


@requires("ott")
def test_sinkhorn_zero_on_equal_measures_and_reports_non_convergence():
    rng = np.random.default_rng(8)
    mu = mf.Particles(rng.normal(size=(50, 2)))
    assert float(W.distance(mu, mu, method="sinkhorn")) == 0
    nu = mf.Particles(rng.normal(size=(50, 2)) + 1)
    d = W.distance(mu, nu, method="sinkhorn", blocked=True, max_iter=1)
    assert not d.converged and d.iterations is not None


# ---- Bures -------------------------------------------------------------------------


def rotation(theta):
    c, s = np.cos(theta), np.sin(theta)
    return np.array([[c, -s], [s, c]])


def test_bures_commuting_case():
    R = rotation(0.7)
    d1, d2 = np.array([2.0, 0.3]), np.array([0.5, 1.7])
    m1, m2 = np.array([1.0, 2.0]), np.array([-0.5, 0.0])
    g1 = mf.Gaussian(m1, R @ np.diag(d1) @ R.T)
    g2 = mf.Gaussian(m2, R @ np.diag(d2) @ R.T)
    ref = np.sqrt(np.sum((m1 - m2) ** 2) + np.sum((np.sqrt(d1) - np.sqrt(d2)) ** 2))
    np.testing.assert_allclose(W.gaussian_w2(g1, g2), ref, rtol=1e-13)


@requires("ot")
def test_bures_zero_symmetric_and_matches_pot():
    import ot

    rng = np.random.default_rng(9)
    M1, M2 = rng.normal(size=(4, 4)), rng.normal(size=(4, 4))
    S1, S2 = M1 @ M1.T + 0.1 * np.eye(4), M2 @ M2.T + 0.1 * np.eye(4)
    m1, m2 = rng.normal(size=4), rng.normal(size=4)
    g1, g2 = mf.Gaussian(m1, S1), mf.Gaussian(m2, S2)
    assert float(W.gaussian_w2(g1, g1)) < 1e-7  # sqrt of a rounding-level square
    np.testing.assert_allclose(W.gaussian_w2(g1, g2), W.gaussian_w2(g2, g1), rtol=1e-12)
    ref = ot.gaussian.bures_wasserstein_distance(m1, m2, S1, S2)
    np.testing.assert_allclose(W.gaussian_w2(g1, g2), ref, rtol=1e-10)


def test_bures_nearly_singular_and_nearly_equal():
    # W^2 = (1e-5 - 2e-5)^2 = 1e-10 against tr S ~ 2: the trace formula loses it to
    # cancellation (absolute error ~ 2 eps), the Procrustes form keeps it exactly.
    g1 = mf.Gaussian(np.zeros(2), np.diag([1.0, 1e-10]))
    g2 = mf.Gaussian(np.zeros(2), np.diag([1.0, 4e-10]))
    np.testing.assert_allclose(W.gaussian_w2(g1, g2), 1e-5, rtol=1e-10)
    # Rotated: the small eigenvalue is only defined to eps |S| / 1e-10 ~ 2e-6
    # relative by the rounded entries, so W is good to ~1e-6 relative.
    R = rotation(0.3)
    g1 = mf.Gaussian(np.zeros(2), R @ np.diag([1.0, 1e-10]) @ R.T)
    g2 = mf.Gaussian(np.zeros(2), R @ np.diag([1.0, 4e-10]) @ R.T)
    np.testing.assert_allclose(W.gaussian_w2(g1, g2), 1e-5, rtol=1e-5)


# ---- conditional -------------------------------------------------------------------


def test_conditional_one_atom_per_position_is_euclidean():
    rng = np.random.default_rng(10)
    n = 12
    x, y, w = rng.normal(size=(n, 3)), rng.normal(size=(n, 3)), simplex(rng, n)
    s = rng.permutation(n) / n
    d = W.conditional(mf.MaskedParticles(x, s, w), mf.MaskedParticles(y, s, w))
    ref = np.sqrt(np.sum(w * np.sum((x - y) ** 2, axis=1)))
    np.testing.assert_allclose(float(d), ref, rtol=1e-13)
    assert d.method == "conditional"


@requires("ot")
def test_conditional_groups_use_exact_transport_within_positions():
    rng = np.random.default_rng(11)
    x, y = rng.normal(size=(6, 2)), rng.normal(size=(6, 2))
    s = np.array([0.0, 0.0, 0.0, 0.5, 0.5, 1.0])  # groups of 3, 2 and 1 atoms
    d = W.conditional(mf.MaskedParticles(x, s), mf.MaskedParticles(y, s), p=2)
    groups = [[0, 1, 2], [3, 4], [5]]
    total = sum(len(g) / 6 * brute_force_uniform(x[g], y[g], 2) ** 2 for g in groups)
    np.testing.assert_allclose(float(d), np.sqrt(total), rtol=1e-12)
    # Mass may not cross positions: never below the unconstrained W_2.
    assert float(d) >= float(W.distance(mf.Particles(x), mf.Particles(y))) - 1e-12


def test_conditional_infinite_when_position_marginals_differ():
    rng = np.random.default_rng(12)
    x, y = rng.normal(size=(4, 2)), rng.normal(size=(4, 2))
    s = np.array([0.0, 0.25, 0.5, 1.0])
    mu = mf.MaskedParticles(x, s)
    assert float(W.conditional(mu, mf.MaskedParticles(y, s[::-1] * 0.9))) == np.inf
    w = np.array([0.1, 0.2, 0.3, 0.4])  # same positions, other masses
    assert float(W.conditional(mu, mf.MaskedParticles(y, s, w))) == np.inf


# ---- stability ---------------------------------------------------------------------


def _pair(rng, n, d, masked=False, scale=0.25):
    x = scale * rng.normal(size=(n, d))
    y = x + 0.05 * rng.normal(size=(n, d))
    if masked:
        s = np.arange(n) / n
        return mf.MaskedParticles(x, s), mf.MaskedParticles(y, s)
    return mf.Particles(x), mf.Particles(y, simplex(rng, n))


STABILITY_CASES = {
    "softmax": (mf.SoftmaxAttention(0.5 * jnp.eye(2), A=0.3 * jnp.eye(2)), False),
    "softmax_QK": (
        mf.SoftmaxAttention(
            jnp.array([[0.0, -1.0], [1.0, 0.0]]),
            Q=jnp.array([[0.5, 0.2], [0.0, 0.4]]),
            K=jnp.array([[0.3, 0.0], [0.1, 0.6]]),
        ),
        False,
    ),
    "l2": (
        mf.L2Attention(-0.5 * jnp.eye(2), Q=0.4 * jnp.eye(2), K=0.5 * jnp.eye(2)),
        False,
    ),
    "masked_softmax": (mf.SoftmaxAttention(jnp.eye(2), A=0.5 * jnp.eye(2)), True),
    "multihead": (
        mf.MultiHeadAttention(
            [
                mf.SoftmaxAttention(jnp.eye(2), A=0.3 * jnp.eye(2)),
                mf.L2Attention(jnp.eye(2), Q=0.3 * jnp.eye(2), K=0.3 * jnp.eye(2)),
            ],
            out=[0.5 * jnp.eye(2), 0.5 * jnp.eye(2)],
        ),
        False,
    ),
}


# The cases (softmax, L2, masked) run by default; the (Q, K) and multi-head
# variants share their code paths and run with -m slow.
SLOW_STABILITY = {"softmax_QK", "multihead"}


@requires("ot")
@pytest.mark.parametrize(
    "name",
    [
        pytest.param(name, marks=pytest.mark.slow) if name in SLOW_STABILITY else name
        for name in STABILITY_CASES
    ],
)
def test_stability_ratio_and_radius_within_bounds(name):
    attn, masked = STABILITY_CASES[name]
    mu0, nu0 = _pair(np.random.default_rng(13), 24, 2, masked)
    ts = np.linspace(0.0, 1.0, 6)
    st = W.stability(mu0, nu0, attn, ts, p=2, rtol=1e-9, atol=1e-9)
    assert st.status == ("success", "success")
    assert st.ratio[0] == pytest.approx(1.0)
    # The check must have teeth: a finite bound and a measurable ratio change.
    assert np.all(np.isfinite(st.bound))
    assert np.max(np.abs(st.ratio - 1)) > 1e-3
    assert np.all(st.ratio <= st.bound)
    # The radius bound is attained by a token that sees only itself (masked: the
    # first one): allow the solve's error (rtol = atol = 1e-9).
    assert np.all(st.radius <= st.radius_bound * (1 + 1e-8))
    assert st.within_bounds(rtol=1e-8)
    assert st.method == ("conditional" if masked else "exact")


def test_gronwall_bound_matches_quadrature():
    v, a, R0 = 0.8, 0.25, 0.9
    attn = mf.SoftmaxAttention(v * jnp.eye(2), A=a * jnp.eye(2))
    ts = np.array([0.0, 0.5, 1.5])
    log_C, R = W.gronwall_bound(attn, ts, R0, d=2)
    np.testing.assert_allclose(R, R0 * np.exp(v * ts), rtol=1e-12)

    def L(s):
        R2 = (R0 * np.exp(v * s)) ** 2
        return v * (1 + 3 * a * R2) * np.exp(2 * a * R2)

    exact = np.array([quad(L, 0, t, epsabs=0, epsrel=1e-12)[0] for t in ts])
    # Right-endpoint sums over-estimate the increasing integrand by O(h) = O(1/4096).
    assert np.all(log_C >= exact)
    np.testing.assert_allclose(log_C, exact, rtol=2e-3)


def test_masked_bound_uses_prefix_average_constant():
    w = np.array([0.5, 0.25, 0.25])
    mu = mf.MaskedParticles(np.zeros((3, 1)), np.array([0.0, 0.5, 0.5]), w)
    # Groups {0}: mass 1/2, prefix 1/2; {0.5}: mass 1/2, prefix 1 -> 1 + 1/2.
    assert hardy_constant(mu, 1) == pytest.approx(1.5)
    assert hardy_constant(mu, 2) == pytest.approx(2.0)
    assert hardy_constant(mf.Particles(np.zeros((3, 1))), 2) == 1.0


@requires("ot")
def test_stability_sinkhorn_has_radius_bound_but_no_ratio_bound():
    attn = mf.SinkhornAttention(jnp.eye(2), A=0.5 * jnp.eye(2))
    mu0, nu0 = _pair(np.random.default_rng(14), 12, 2)
    st = W.stability(mu0, nu0, attn, np.linspace(0, 0.5, 3))
    assert np.all(np.isinf(st.bound))
    assert np.all(st.radius <= st.radius_bound * (1 + 1e-9))


@requires("ot")
def test_plot_stability_draws_both_panels():
    attn, _ = STABILITY_CASES["softmax"]
    mu0, nu0 = _pair(np.random.default_rng(15), 10, 2)
    st = W.stability(mu0, nu0, attn, np.linspace(0, 1, 4))
    fig = plotting.plot_stability(st, title="softmax")
    ratio_ax, radius_ax = fig.axes
    assert len(ratio_ax.lines) == 2 and len(radius_ax.lines) == 2
    matplotlib.pyplot.close(fig)


# ---- bad input ---------------------------------------------------------------------


def test_bad_input_errors():
    rng = np.random.default_rng(16)
    mu2 = mf.Particles(rng.normal(size=(4, 2)))
    mu3 = mf.Particles(rng.normal(size=(4, 3)))
    with pytest.raises(ValueError, match="same dimension d"):
        W.distance(mu2, mu3)
    with pytest.raises(ValueError, match="`p` must be a finite number >= 1"):
        W.distance(mu2, mu2, p=0.5)
    with pytest.raises(ValueError, match="`method` must be one of"):
        W.distance(mu2, mu2, method="sinkhorn_log")
    with pytest.raises(ValueError, match="`epsilon` must be > 0"):
        W.distance(
            mu2, mf.Particles(rng.normal(size=(4, 2))), method="sinkhorn", epsilon=0
        )
    with pytest.raises(ValueError, match="`max_iter` must be a positive integer"):
        W.distance(
            mu2, mf.Particles(rng.normal(size=(4, 2))), method="sinkhorn", max_iter=0
        )
    with pytest.raises(ValueError, match="`weights` must be nonnegative"):
        mf.Particles(np.zeros((2, 2)), np.array([1.5, -0.5]))
    masked = mf.MaskedParticles(np.zeros((2, 2)), np.array([0.0, 1.0]))
    with pytest.raises(ValueError, match="use `conditional`"):
        W.distance(masked, mu2)
    with pytest.raises(ValueError, match="`mu` must be a MaskedParticles"):
        W.conditional(mu2, masked)
    g2, g3 = mf.Gaussian(np.zeros(2), np.eye(2)), mf.Gaussian(np.zeros(3), np.eye(3))
    with pytest.raises(ValueError, match="same dimension d"):
        W.gaussian_w2(g2, g3)
    attn = mf.SoftmaxAttention(jnp.eye(2), A=jnp.eye(2))
    with pytest.raises(ValueError, match="both be MaskedParticles"):
        W.stability(masked, mu2, attn, [0.0, 1.0])
    with pytest.raises(ValueError, match="strictly increasing"):
        W.stability(mu2, mf.Particles(rng.normal(size=(4, 2))), attn, [1.0, 0.0])


@requires("ot")
def test_stability_of_coinciding_measures_is_refused():
    # Found by the initial distance (the exact W_p), hence POT.
    mu = mf.Particles(np.random.default_rng(16).normal(size=(4, 2)))
    attn = mf.SoftmaxAttention(jnp.eye(2), A=jnp.eye(2))
    with pytest.raises(ValueError, match="coincide"):
        W.stability(mu, mu, attn, [0.0, 1.0])
