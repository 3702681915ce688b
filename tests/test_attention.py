from decimal import Decimal, localcontext

import equinox as eqx
import jax
import jax.numpy as jnp
import jax.random as jr
import numpy as np
import pytest
from helpers import (
    KERNELS,
    ill_posed_velocity_numpy,
    l2_velocity_numpy,
    sinkhorn_numpy,
    sinkhorn_velocity_numpy,
    softmax_velocity_numpy,
)
from scipy.integrate import quad
from scipy.special import logsumexp

import meanfield as mf

# Invariants every family satisfies (permutation equivariance, split Diracs,
# velocity_at at the atoms, ...) are parametrised over the registry in
# test_families.py; this file checks values against naive references.
ILL_POSED = {
    "unnormalized": mf.UnnormalizedAttention,
    "linear": mf.LinearAttention,
    "relu": mf.ReLUAttention,
    "sigmoid": mf.SigmoidAttention,
}


def _data(key, n, d, k=None, scale=0.5):
    kx, kw, ka, kv, kq, kk, ks = jr.split(key, 7)
    k = d if k is None else k
    x = np.asarray(jr.normal(kx, (n, d)))
    w = np.asarray(jr.dirichlet(kw, jnp.ones(n)))
    A = scale * np.asarray(jr.normal(ka, (d, d)))
    V = np.asarray(jr.normal(kv, (d, d)))
    Q = scale * np.asarray(jr.normal(kq, (k, d)))
    K = scale * np.asarray(jr.normal(kk, (k, d)))
    s = np.asarray(jr.uniform(ks, (n,)))
    return x, w, A, V, Q, K, s


# float64 with O(n d^2) flops on O(1) data: agreement ~1e-14; 1e-12 has margin.
TOL = dict(rtol=1e-12, atol=1e-12)
velocity = jax.jit(lambda att, mu: att.velocity(mu))


@pytest.mark.parametrize("n, d", [(1, 2), (7, 3), (40, 4)])
@pytest.mark.parametrize("weighted", [False, True])
@pytest.mark.parametrize("masked", [False, True])
def test_softmax_and_l2_match_naive_loop(key, n, d, weighted, masked):
    x, w, A, V, Q, K, s = _data(key, n, d, k=2)
    w = w if weighted else np.full(n, 1 / n)
    mu = mf.MaskedParticles(x, s, w) if masked else mf.Particles(x, w)
    mask = dict(query_pos=s, key_pos=s) if masked else {}
    cases = [
        (mf.SoftmaxAttention(V, A=A), softmax_velocity_numpy(x, x, w, V, A=A, **mask)),
        (
            mf.SoftmaxAttention(V, Q=Q, K=K),
            softmax_velocity_numpy(x, x, w, V, Q=Q, K=K, **mask),
        ),
        (mf.L2Attention(V, Q=Q, K=K), l2_velocity_numpy(x, x, w, V, Q, K, **mask)),
    ]
    for attn, want in cases:
        np.testing.assert_allclose(velocity(attn, mu), want, **TOL)


@pytest.mark.parametrize("name", sorted(ILL_POSED))
@pytest.mark.parametrize(
    "weighted, masked", [(False, False), (True, False), (True, True)]
)
def test_ill_posed_kernels_match_naive_loop(key, name, weighted, masked):
    n, d = 9, 3
    x, w, A, V, _, _, s = _data(key, n, d)
    w = w if weighted else np.full(n, 1 / n)
    mu = mf.MaskedParticles(x, s, w) if masked else mf.Particles(x, w)
    mask = dict(query_pos=s, key_pos=s) if masked else {}
    want = ill_posed_velocity_numpy(x, x, w, V, KERNELS[name], A, **mask)
    np.testing.assert_allclose(velocity(ILL_POSED[name](V, A=A), mu), want, **TOL)


@pytest.mark.parametrize("kernel", ["dot", "l2"])
@pytest.mark.parametrize("weighted", [False, True])
def test_sinkhorn_matches_naive_loop(key, kernel, weighted):
    n, d = 12, 3
    x, w, A, V, Q, K, _ = _data(key, n, d)
    w = w if weighted else np.full(n, 1 / n)
    if kernel == "dot":
        attn = mf.SinkhornAttention(V, A=A, tol=1e-13)
        log_k = lambda a, b: float(np.dot(A @ a, b))
    else:
        attn = mf.SinkhornAttention(V, Q=Q, K=K, kernel="l2", tol=1e-13)
        log_k = lambda a, b: -float(np.sum((Q @ a - K @ b) ** 2))
    got = velocity(attn, mf.Particles(x, w))
    want = sinkhorn_velocity_numpy(x, w, V, log_k)
    # Both stop at |dg| < 1e-13; the velocity inherits that error times |V x| ~ 1.
    np.testing.assert_allclose(got, want, rtol=1e-10, atol=1e-10)


def test_sinkhorn_l2_equals_dot_with_2A(key):
    x, w, _, V, Q, K, _ = _data(key, 10, 3)
    mu = mf.Particles(x, w)
    l2 = mf.SinkhornAttention(V, Q=Q, K=K, kernel="l2", tol=1e-13)
    dot = mf.SinkhornAttention(V, A=2 * K.T @ Q, tol=1e-13)
    np.testing.assert_allclose(
        velocity(l2, mu), velocity(dot, mu), rtol=1e-10, atol=1e-10
    )


@pytest.mark.parametrize("weighted", [False, True])
def test_sinkhorn_kernel_is_doubly_stochastic(key, weighted):
    n, d = 30, 3
    x, w, A, V, _, _, _ = _data(key, n, d, scale=1.0)
    w = w if weighted else np.full(n, 1 / n)
    tol = 1e-9
    pot = mf.SinkhornAttention(V, A=A, tol=tol).potentials(mf.Particles(x, w))
    assert bool(pot.converged)
    k = np.exp(x @ A.T @ x.T + np.asarray(pot.f)[:, None] + np.asarray(pot.g)[None, :])
    rows, cols = k @ w, w @ k
    np.testing.assert_allclose(rows, 1, atol=1e-13)  # last step normalises rows
    # Stopping at |dg| < tol leaves a column error e^{dg} - 1 ~ tol.
    assert np.max(np.abs(cols - 1)) <= 2 * tol
    assert float(pot.marginal_error) <= 2 * tol


def test_sinkhorn_zero_iterations_is_softmax(key):
    x, w, A, V, _, _, _ = _data(key, 15, 3)
    mu = mf.Particles(x, w)
    one_normalisation = mf.SinkhornAttention(V, A=A, max_iter=0)
    np.testing.assert_allclose(
        velocity(one_normalisation, mu),
        velocity(mf.SoftmaxAttention(V, A=A), mu),
        **TOL,
    )


def test_sinkhorn_reports_non_convergence(key):
    x, w, A, V, _, _, _ = _data(key, 20, 3, scale=2.0)
    attn = mf.SinkhornAttention(V, A=A, max_iter=2, tol=1e-14)
    vel, ok = attn.velocity_and_status(mf.Particles(x, w))
    assert not bool(ok)
    assert np.all(np.isfinite(vel))
    pot = attn.potentials(mf.Particles(x, w))
    assert int(pot.iterations) == 2 and float(pot.marginal_error) > 1e-14


def test_sinkhorn_numpy_reference_is_doubly_stochastic(key):
    # The reference itself must satisfy what it is used to check.
    x, w, A, _, _, _, _ = _data(key, 8, 2)
    f, g, logits = sinkhorn_numpy(x, w, lambda a, b: float(np.dot(A @ a, b)))
    k = np.exp(logits + f[:, None] + g[None, :])
    np.testing.assert_allclose(k @ w, 1, atol=1e-12)
    np.testing.assert_allclose(w @ k, 1, atol=1e-12)


def test_masked_equivariance_joint_not_in_x_alone(key):
    n, d = 11, 3
    x, w, A, V, _, _, s = _data(key, n, d)
    perm = np.asarray(jr.permutation(jr.key(1), n))
    attn = mf.SoftmaxAttention(V, A=A)
    v = velocity(attn, mf.MaskedParticles(x, s, w))
    joint = velocity(attn, mf.MaskedParticles(x[perm], s[perm], w[perm]))
    np.testing.assert_allclose(joint, v[perm], **TOL)
    x_only = velocity(attn, mf.MaskedParticles(x[perm], s, w[perm]))
    assert np.max(np.abs(x_only - v[perm])) > 1e-3


def test_positions_i_over_n_give_discrete_causal_attention(key):
    # f^m(X)_i = f(x_1, ..., x_i)_i: attention over the first i tokens only.
    n, d = 9, 3
    x, _, A, V, _, _, _ = _data(key, n, d)
    s = np.arange(1, n + 1) / n
    attn = mf.SoftmaxAttention(V, A=A)
    got = velocity(attn, mf.MaskedParticles(x, s))
    for i in range(n):
        prefix = velocity(attn, mf.Particles(x[: i + 1]))[i]
        np.testing.assert_allclose(got[i], prefix, **TOL)


def test_masked_position_coordinate_has_no_velocity(key):
    x, w, A, V, _, _, s = _data(key, 8, 2)
    mu = mf.MaskedParticles(x, s, w)
    sol = mf.simulate(mu, mf.SoftmaxAttention(V, A=A), 0.5)
    np.testing.assert_array_equal(sol.measure(-1).positions, s)
    np.testing.assert_array_equal(sol.measure(-1).weights, w)


def test_zero_weight_atoms_are_ignored(key):
    x, w, A, V, _, _, _ = _data(key, 6, 2)
    w0 = np.concatenate([w, [0.0]])
    x0 = np.concatenate([x, 100 * np.ones((1, 2))])
    attn = mf.SoftmaxAttention(V, A=A)
    np.testing.assert_allclose(
        attn.velocity_at(mf.Particles(x0, w0), x),
        velocity(attn, mf.Particles(x, w)),
        **TOL,
    )


def test_multihead_with_one_head_equals_the_head(key):
    x, w, A, V, Q, K, s = _data(key, 10, 3)
    for head in [mf.SoftmaxAttention(V, A=A), mf.L2Attention(V, Q=Q, K=K)]:
        for mu in [mf.Particles(x, w), mf.MaskedParticles(x, s, w)]:
            np.testing.assert_allclose(
                velocity(mf.MultiHeadAttention([head]), mu), velocity(head, mu), **TOL
            )


def test_multihead_applies_output_matrices(key):
    x, w, A, V, Q, K, _ = _data(key, 10, 3)
    W1, W2 = np.asarray(jr.normal(jr.key(5), (2, 3, 3)))
    h1, h2 = mf.SoftmaxAttention(V, A=A), mf.L2Attention(V, Q=Q, K=K)
    mu = mf.Particles(x, w)
    got = velocity(mf.MultiHeadAttention([h1, h2], out=[W1, W2]), mu)
    want = velocity(h1, mu) @ W1.T + velocity(h2, mu) @ W2.T
    np.testing.assert_allclose(got, want, **TOL)


def test_float32_stays_finite_for_logits_of_1e4():
    # <A x_i, x_j> up to 1e4 in magnitude: exp would overflow without max-shifting.
    x = np.array([[100.0, 0.0], [-100.0, 0.0], [0.0, 100.0]], np.float32)
    V = np.eye(2, dtype=np.float32)
    for A in [np.eye(2, dtype=np.float32), -np.eye(2, dtype=np.float32)]:
        mu = mf.Particles(x)
        for attn in [
            mf.SoftmaxAttention(V, A=A),
            mf.L2Attention(V, Q=np.eye(2, dtype=np.float32), K=A),
            mf.SinkhornAttention(V, A=A),
            mf.MultiHeadAttention([mf.SoftmaxAttention(V, A=A)]),
        ]:
            v = velocity(attn, mu)
            assert v.dtype == jnp.float32
            assert np.all(np.isfinite(np.asarray(v))), type(attn).__name__
        # The hardmax limit: each token moves towards its best match.
        np.testing.assert_allclose(
            velocity(mf.SoftmaxAttention(V, A=np.eye(2, dtype=np.float32)), mu), x
        )


def test_unnormalized_exp_overflows_only_when_the_value_does():
    # sum_j w_j e^{s_j} v_j with s ~ 600: representable in float64 (e^600 ~ 1e260).
    x = np.array([[np.sqrt(600.0), 0.0], [np.sqrt(600.0), 0.0]])
    v = velocity(mf.UnnormalizedAttention(np.eye(2), A=np.eye(2)), mf.Particles(x))
    np.testing.assert_allclose(v[:, 0], np.exp(600.0) * np.sqrt(600.0), rtol=1e-12)


def _exp_kernel_sum_log_space(x, w, V, beta, log_scale):
    """sum_j w_j e^{beta <x_i, x_j> + c} V x_j, each sum a signed logsumexp."""
    values = x @ V.T
    logits = beta * x @ x.T + log_scale
    out = np.empty_like(values)
    for i, k in np.ndindex(*values.shape):
        log, sign = logsumexp(logits[i], b=w * values[:, k], return_sign=True)
        out[i, k] = sign * np.exp(log)
    return out


@pytest.mark.parametrize(
    "beta, V, log_scale",
    [(720.0, np.exp(-700.0) * np.eye(2), 0.0), (800.0, np.eye(2), -800.0)],
    ids=["V=e^-700", "log_scale=-800"],
)
def test_unnormalized_past_beta_709_keeps_the_value_scale_in_the_exponent(
    beta, V, log_scale
):
    # e^{beta <x_i, x_i>} overflows past beta = 709.8 while the field, scaled by
    # small values, is representable. e^-800 is 0 in float64: log_scale.
    rng = np.random.default_rng(3)
    theta = rng.uniform(0, 2 * np.pi, 6)
    x = np.stack([np.cos(theta), np.sin(theta)], 1)
    w = rng.dirichlet(np.ones(6))
    attn = mf.UnnormalizedAttention(V, A=beta * np.eye(2), log_scale=log_scale)
    got = np.asarray(velocity(attn, mf.Particles(x, w)))
    want = _exp_kernel_sum_log_space(x, w, V, beta, log_scale)
    assert np.abs(want).max() < np.exp(21)  # at most e^{beta - 700}: representable
    # Exponents of size beta = 800 carry absolute rounding ~ beta eps ~ 2e-13
    # between the two evaluations: a relative difference of that order.
    np.testing.assert_allclose(got, want, rtol=1e-11, atol=0)


def test_unnormalized_two_tokens_at_beta_800_merge_as_quadrature_says():
    # V = I, log_scale = -beta on S^1, weights 1/2: the gap phi between the two
    # tokens obeys phi' = -e^{beta (cos phi - 1)} sin phi (each token moves by
    # half of P^perp_{x_i} e^{beta(cos phi - 1)} x_j), so phi0 -> phi0 / 2 takes
    # T = int_{phi0/2}^{phi0} e^{beta (1 - cos p)} / sin p dp.
    beta, phi0 = 800.0, 0.05
    T = quad(
        lambda p: np.exp(beta * (1 - np.cos(p))) / np.sin(p),
        phi0 / 2,
        phi0,
        epsabs=0,
        epsrel=1e-13,
    )[0]
    x = np.stack([np.cos([0.0, phi0]), np.sin([0.0, phi0])], 1)
    attn = mf.UnnormalizedAttention(np.eye(2), A=beta * np.eye(2), log_scale=-beta)
    sol = mf.simulate(
        mf.Particles(x), attn, T, normalization="sphere", rtol=1e-12, atol=1e-12
    )
    assert sol.status == "success"
    x1 = np.asarray(sol.x[-1])
    phi = np.arctan2(x1[1, 1], x1[1, 0]) - np.arctan2(x1[0, 1], x1[0, 0])
    # The solve's global error at rtol 1e-12, relative in phi (~1e-11).
    np.testing.assert_allclose(phi, phi0 / 2, rtol=1e-9)


def _sphere_terms_decimal(x, beta, log_scale):
    """w_j e^{beta <x_i, x_j> + c} P^perp_{x_i} x_j (w = 1/n) in 60-digit decimals,
    shape (n, n, d): an independent reference for the tangential field."""
    n = len(x)
    terms = np.empty((n, n, x.shape[1]))
    with localcontext() as ctx:
        ctx.prec = 60
        X = [[Decimal(float(v)) for v in row] for row in x]
        for i, j in np.ndindex(n, n):
            dot = sum(a * b for a, b in zip(X[i], X[j], strict=True))
            k = (Decimal(beta) * dot + Decimal(log_scale)).exp() / n
            norm2 = sum(a * a for a in X[i])
            for c in range(x.shape[1]):
                terms[i, j, c] = float(k * (X[j][c] - dot * X[i][c] / norm2))
    return terms


def test_unnormalized_sphere_velocity_keeps_its_relative_precision_at_beta_500():
    # Koubbi-type scaling V = e^{-beta} / n: each atom's own term is radial and
    # e^{35} times the tangential pull of its neighbours, below float64's eps.
    beta, n = 500.0, 5
    theta = np.array([0.0, 0.38, 0.8, 1.25, 1.7])
    x = np.stack([np.cos(theta), np.sin(theta)], 1)
    log_scale = -beta - np.log(n)
    attn = mf.UnnormalizedAttention(np.eye(2), A=beta * np.eye(2), log_scale=log_scale)
    mu = mf.Particles(x)
    terms = _sphere_terms_decimal(x, beta, log_scale)
    want, size = terms.sum(1), np.abs(terms).sum(1)
    # Exponents of size beta carry rounding beta eps ~ 1e-13 per term: the
    # error is bounded by that times the sum of the terms' magnitudes (atom 3
    # sits midway between two others, whose pulls cancel to 1e-13 of each).
    bound = 1e-12 * np.linalg.norm(size, axis=1)
    got = np.asarray(attn.sphere_velocity(mu))
    assert np.all(np.linalg.norm(got - want, axis=1) <= bound)
    # Projecting the field loses it: errors of 1e6 times the field at atom 4.
    projected = np.asarray(attn.velocity(mu))
    projected = projected - np.sum(projected * x, 1, keepdims=True) * x
    assert np.any(np.linalg.norm(projected - want, axis=1) > 1e3 * bound)


@pytest.mark.parametrize("masked", [False, True])
def test_unnormalized_sphere_velocity_is_the_projected_field(key, masked):
    # At moderate beta the two evaluations agree, for any V (its part beyond
    # the median of its diagonal enters through Z_i (V - lam I) x_i).
    x, w, A, V, _, _, s = _data(key, 7, 3)
    x = x / np.linalg.norm(x, axis=1, keepdims=True)
    mu = mf.MaskedParticles(x, s, w) if masked else mf.Particles(x, w)
    attn = mf.UnnormalizedAttention(V, A=A, log_scale=0.3)
    got = np.asarray(jax.jit(lambda a, m: a.sphere_velocity(m))(attn, mu))
    vel = np.asarray(velocity(attn, mu))
    want = vel - np.sum(vel * x, 1, keepdims=True) * x
    # O(n d) flops on O(1) data: agreement to ~1e-15.
    np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-13)


def _hardmax_velocity(x, V, logits):
    # Logit gaps of order |x|^2 make the softmax exactly one-hot on the row argmax.
    return x[np.argmax(logits, axis=1)] @ V.T


@pytest.mark.parametrize("blocking", ["dense", "blocked"])
@pytest.mark.parametrize(
    "dtype, scale", [(np.float64, 1e200), (np.float32, 1e20)], ids=["f64", "f32"]
)
def test_huge_tokens_give_the_representable_field(key, blocking, dtype, scale):
    # |x| = 1e200 (float64) or 1e20 (float32): the logits overflow, the field is
    # finite. It used to be all NaN (inf - inf in the max shift).
    x, _, A, V, Q, K, s = _data(key, 6, 3)
    big, V, A, Q, K = (a.astype(dtype) for a in (scale * x, V, A, Q, K))
    mu = mf.Particles(big)
    soft = velocity(mf.SoftmaxAttention(V, A=A, blocking=blocking), mu)
    l2 = velocity(mf.L2Attention(V, Q=Q, K=K, blocking=blocking), mu)
    # The weights are exactly one-hot (exp of gaps ~ -|x|^2 is 0): what differs is
    # the rounding of V x_j, a few ulps of the dtype.
    rtol = 64 * np.finfo(dtype).eps
    want = _hardmax_velocity(big, V, x @ A.T @ x.T)
    np.testing.assert_allclose(soft, want, rtol=rtol)
    kx = x @ K.T
    l2_logits = 2 * (x @ Q.T) @ kx.T - np.sum(kx**2, axis=1)[None, :]
    np.testing.assert_allclose(l2, _hardmax_velocity(big, V, l2_logits), rtol=rtol)
    masked = mf.MaskedParticles(big, s.astype(dtype))
    got = velocity(mf.SoftmaxAttention(V, A=A, blocking=blocking), masked)
    assert np.all(np.isfinite(np.asarray(got)))


def test_logit_scaling_is_exact(key):
    # x -> 2^300 x with A -> 2^-600 A leaves the logits unchanged: the velocity
    # scales by 2^300 to the last bit (the overflow path divides by powers of two).
    x, w, A, V, _, _, s = _data(key, 7, 3)
    c = 2.0**300
    for mu, big in [
        (mf.Particles(x, w), mf.Particles(c * x, w)),
        (mf.MaskedParticles(x, s, w), mf.MaskedParticles(c * x, s, w)),
    ]:
        for blocking in ("dense", "blocked"):
            small = velocity(mf.SoftmaxAttention(V, A=A, blocking=blocking), mu)
            large = velocity(mf.SoftmaxAttention(V, A=A / c**2, blocking=blocking), big)
            np.testing.assert_array_equal(np.asarray(large), c * np.asarray(small))


def test_sinkhorn_with_overflowing_logits_is_not_converged():
    x = 1e200 * np.array([[1.0, 0.2], [0.3, -1.0], [-0.5, 0.4]])
    attn = mf.SinkhornAttention(np.eye(2), A=np.eye(2))
    pot = attn.potentials(mf.Particles(x))
    assert not bool(pot.converged) and float(pot.marginal_error) == np.inf
    sol = mf.simulate(mf.Particles(x), attn, 1.0, blowup_radius=1e210)
    assert sol.status == "sinkhorn_not_converged" and np.isinf(float(sol.blowup_time))


def test_callable_parameter_returning_nan_is_named(key):
    x, w, A, V, _, _, _ = _data(key, 4, 2)
    attn = mf.SoftmaxAttention(lambda t: jnp.log(1 - t) * V, A=A)
    mu = mf.Particles(x, w)
    with pytest.raises(ValueError, match=r"`V` \(a function of t\) returned NaN"):
        attn.velocity(mu, t=2.0)
    # Inside the jitted solve: a runtime error naming the parameter, not a blow-up.
    with pytest.raises(Exception, match=r"`V` \(a function of t\) returned NaN"):
        mf.simulate(mu, attn, 2.0)
    assert mf.simulate(mu, attn, 0.5).status == "success"
    heads = mf.MultiHeadAttention(
        [mf.SoftmaxAttention(V, A=A)], out=[lambda t: jnp.full((2, 2), jnp.nan)]
    )
    with pytest.raises(ValueError, match=r"`out\[0\]` \(a function of t\)"):
        heads.velocity(mu)


def test_masked_query_before_every_key_has_zero_velocity(key):
    x, w, A, V, _, _, _ = _data(key, 5, 2)
    mu = mf.MaskedParticles(x, np.full(5, 0.5), w)
    v = mf.SoftmaxAttention(V, A=A).velocity_at(
        mu, x[:2], positions=np.array([0.1, 0.5])
    )
    np.testing.assert_array_equal(v[0], 0)
    assert np.all(np.abs(v[1]) > 0)


def test_piecewise_constant_parameters(key):
    x, w, A, V, _, _, _ = _data(key, 6, 2)
    Vs = np.stack([V, 2 * V, 3 * V])
    attn = mf.SoftmaxAttention(mf.PiecewiseConstant(Vs, t1=3.0), A=A)
    mu = mf.Particles(x, w)
    base = velocity(mf.SoftmaxAttention(V, A=A), mu)
    vel_t = jax.jit(lambda att, mu, t: att.velocity(mu, t=t))
    for t, factor in [(0.0, 1), (0.99, 1), (1.0, 2), (2.5, 3), (7.0, 3), (-1.0, 1)]:
        np.testing.assert_allclose(vel_t(attn, mu, t), factor * base, **TOL)
    # A NaN time has no layer: NaN, not layer 0 (where int(NaN) used to land).
    assert np.all(np.isnan(mf.PiecewiseConstant(Vs, t1=3.0)(np.nan)))


def test_callable_parameters(key):
    x, w, A, V, _, _, _ = _data(key, 6, 2)
    attn = mf.SoftmaxAttention(lambda t: (1 + t) * V, A=A)
    mu = mf.Particles(x, w)
    base = velocity(mf.SoftmaxAttention(V, A=A), mu)
    got = eqx.filter_jit(lambda att, mu: att.velocity(mu, t=2.0))(attn, mu)
    np.testing.assert_allclose(got, 3 * base, **TOL)


def test_vmap_over_parameter_sets(key):
    x, w, _, _, _, _, _ = _data(key, 7, 2)
    As = np.asarray(jr.normal(jr.key(7), (4, 2, 2)))
    Vs = np.asarray(jr.normal(jr.key(8), (4, 2, 2)))
    mu = mf.Particles(x, w)
    batched = jax.vmap(lambda A, V: mf.SoftmaxAttention(V, A=A).velocity(mu))(As, Vs)
    for b in range(4):
        want = softmax_velocity_numpy(x, x, w, Vs[b], A=As[b])
        np.testing.assert_allclose(batched[b], want, **TOL)


def test_grad_matches_finite_differences(key):
    x, w, A, V, Q, K, _ = _data(key, 6, 2)
    mu = mf.Particles(x, w)
    direction = np.asarray(jr.normal(jr.key(9), A.shape))
    for make in [
        lambda M: mf.SoftmaxAttention(V, A=M),
        lambda M: mf.SinkhornAttention(V, A=M, tol=1e-13),
        lambda M: mf.L2Attention(V, Q=M, K=K),
        lambda M: mf.UnnormalizedAttention(V, A=M),
    ]:
        loss = lambda M, make=make: jnp.sum(jnp.sin(make(M).velocity(mu)))
        g = jax.grad(loss)(jnp.asarray(A))
        eps = 1e-6
        fd = (loss(A + eps * direction) - loss(A - eps * direction)) / (2 * eps)
        # Central differences: O(eps^2) truncation + O(1e-16 / eps) rounding ~ 1e-10.
        np.testing.assert_allclose(np.sum(g * direction), fd, rtol=1e-6, atol=1e-8)


def test_grad_with_respect_to_positions(key):
    x, w, A, V, _, _, _ = _data(key, 6, 2)
    attn = mf.SinkhornAttention(V, A=A, tol=1e-13)
    loss = lambda x: jnp.sum(attn.velocity(mf.Particles(x, w)) ** 2)
    g = jax.grad(loss)(jnp.asarray(x))
    direction = np.asarray(jr.normal(jr.key(2), x.shape))
    eps = 1e-6
    fd = (loss(x + eps * direction) - loss(x - eps * direction)) / (2 * eps)
    np.testing.assert_allclose(np.sum(g * direction), fd, rtol=1e-6)


@pytest.mark.parametrize(
    "build, match",
    [
        (lambda: mf.SoftmaxAttention(np.eye(2)), r"either `A` .* or both `Q` and `K`"),
        (
            lambda: mf.SoftmaxAttention(
                np.eye(2), A=np.eye(2), Q=np.eye(2), K=np.eye(2)
            ),
            r"not both",
        ),
        (lambda: mf.SoftmaxAttention(np.eye(2), A=np.eye(3)), r"`A` must have shape"),
        (
            lambda: mf.SoftmaxAttention(np.ones((2, 3)), A=np.eye(2)),
            r"`V` must have shape",
        ),
        (
            lambda: mf.L2Attention(np.eye(2), Q=np.ones((1, 2)), K=np.ones((2, 2))),
            r"`Q` and `K` must both have shape",
        ),
        (
            lambda: mf.SinkhornAttention(np.eye(2), A=np.eye(2), kernel="cosine"),
            r"`kernel` must be one of",
        ),
        (
            lambda: mf.SinkhornAttention(np.eye(2), A=np.eye(2), kernel="l2"),
            r'kernel="l2" needs `Q` and `K`',
        ),
        (
            lambda: mf.SinkhornAttention(np.eye(2), A=np.eye(2), max_iter=-1),
            r"max_iter",
        ),
        (lambda: mf.MultiHeadAttention([]), r"at least one"),
        (
            lambda: mf.MultiHeadAttention(
                [mf.SoftmaxAttention(np.eye(2), A=np.eye(2))], out=[]
            ),
            r"one matrix per head",
        ),
        (
            lambda: mf.SoftmaxAttention(np.eye(2), A=np.full((2, 2), np.nan)),
            r"`A` contains NaN",
        ),
        (
            lambda: mf.UnnormalizedAttention(np.eye(2), A=np.eye(2), log_scale=np.inf),
            r"`log_scale` must be finite",
        ),
        (
            lambda: mf.UnnormalizedAttention(np.eye(2), A=np.eye(2), log_scale=[0.0]),
            r"`log_scale` must be a real scalar",
        ),
    ],
)
def test_bad_attention_arguments(build, match):
    with pytest.raises(ValueError, match=match):
        build()


def test_bad_velocity_calls():
    attn = mf.SoftmaxAttention(np.eye(2), A=np.eye(2))
    mu = mf.Particles(np.zeros((3, 2)))
    masked = mf.MaskedParticles(np.zeros((3, 2)), np.zeros(3))
    with pytest.raises(ValueError, match=r"`z` must have shape \(m, d\) with d = 2"):
        attn.velocity_at(mu, np.zeros((4, 3)))
    with pytest.raises(
        ValueError, match=r"`positions` \(m,\) of the query points is required"
    ):
        attn.velocity_at(masked, np.zeros((4, 2)))
    with pytest.raises(ValueError, match=r"only meaningful for MaskedParticles"):
        attn.velocity_at(mu, np.zeros((4, 2)), positions=np.zeros(4))
    with pytest.raises(ValueError, match=r"`A` must have shape \(2, 2\) for tokens"):
        mf.SoftmaxAttention(np.eye(3), A=np.eye(3)).velocity(mu)
    with pytest.raises(ValueError, match=r"mf.gaussian.velocity"):
        attn.velocity(mf.Gaussian(np.zeros(2), np.eye(2)))
    with pytest.raises(ValueError, match=r"does not support MaskedParticles"):
        mf.SinkhornAttention(np.eye(2), A=np.eye(2)).velocity(masked)
