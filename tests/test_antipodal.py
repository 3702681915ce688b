"""Two tokens under a common matrix noise: P(<x_1, x_2> -> -1) from the scale
function (`antipodal_probability`) against closed forms, an independent
quadrature in z = atanh(rho), Euler-Maruyama Monte Carlo of the 1-D diffusion and
of the two tokens on the sphere, and the threshold cosh 2 beta = d - 2 of the
two-token reduction against the sign of the Lyapunov exponent at rho = -1."""

import math

import numpy as np
import pytest
from scipy.integrate import cumulative_simpson, simpson
from scipy.special import betainc, expit

from meanfield.clustering._antipodal import (
    antipodal_probability,
    antipodal_threshold,
    pair_coefficients,
)

# Monte Carlo agreement: |estimate - P| < 4 binomial standard errors. Under the
# normal approximation a correct P fails one check with probability 6e-5; the
# seeds are fixed, so a pass is reproducible.
SE_FACTOR = 4.0


def _weights(rho, beta, attention):
    """Attention weights (self, other) of two tokens, written out afresh."""
    if attention == "softmax":
        return expit(beta * (1 - rho)), expit(-beta * (1 - rho))
    return np.exp(beta) / 2 + 0 * rho, np.exp(beta * rho) / 2


def _g(rho, beta, d, sigma, noise, attention):
    """g with 2b/a = (g - rho) / (1 - rho^2), from the weights (not the module)."""
    p, q = _weights(rho, beta, attention)
    if noise == "values":
        return (d - 2) * 2 * p * q / (p**2 + q**2)
    return 2 * d * q / sigma**2


def _probability_in_z(rho0, beta, d, sigma=1.0, noise="values", attention="softmax"):
    """The same P by another route: s' d rho = sech(z) e^{-int_0^z g(tanh w) dw} dz.

    With rho = tanh z, d rho / (1 - rho^2) = dz, so the scale measure is
    sech(z) exp(-int_0^z g) dz on the whole line; as z -> -inf it decays like
    e^{(1 - g(-1)) z}. Composite Simpson on uniform grids either side of
    z0 = atanh(rho0), out to where the tail is below e^{-35} of the total; the
    integrand is smooth, so the error is O(h^4): ~1e-11 at h = 2e-3 (the
    exponent G by cumulative Simpson, likewise).
    """
    g_lo = _g(-1.0, beta, d, sigma, noise, attention)
    assert g_lo < 1
    z0 = float(np.arctanh(rho0))
    span = 35 / (1 - g_lo) + 5
    k = 2 * math.ceil(span / 4e-3)  # an even number of intervals on each side
    left = np.linspace(-span, z0, k + 1)
    right = np.linspace(z0, span, k + 1)

    def log_density(z):
        # log(sech z) - G(z), G = int_{z0}^z g by Simpson's cumulative rule: a
        # constant in G cancels in the ratio, so both sides start from z0.
        g = _g(np.tanh(z), beta, d, sigma, noise, attention)
        big_g = cumulative_simpson(g, x=z, initial=0.0)
        big_g -= big_g[-1] if z[-1] == z0 else 0.0
        return np.log(2) - np.logaddexp(z, -z) - big_g

    log_left, log_right = log_density(left), log_density(right)
    top = max(log_left.max(), log_right.max())
    mass_left = simpson(np.exp(log_left - top), x=left)
    mass_right = simpson(np.exp(log_right - top), x=right)
    return mass_right / (mass_left + mass_right)


@pytest.mark.parametrize("beta", [0.0, 0.7, 5.0])
def test_two_dimensions_gives_the_initial_angle_over_pi(beta):
    # d = 2, values: g = 0 and s' = (1 - rho^2)^{-1/2}, so P = arccos(rho0) / pi
    # whatever beta. Quadrature at rtol 1e-10.
    rho0 = np.linspace(-0.99, 0.99, 9)
    got = antipodal_probability(rho0, beta, d=2)
    np.testing.assert_allclose(got, np.arccos(rho0) / np.pi, rtol=1e-9, atol=1e-12)


@pytest.mark.parametrize("d, sigma", [(2, 2.0), (3, 3.0), (4, 2.5)])
def test_constant_g_gives_an_incomplete_beta_function(d, sigma):
    # tokens, softmax, beta = 0: q = 1/2, g = d / sigma^2 = c constant. With
    # rho = cos(theta), s' d rho = -tan(theta/2)^c d theta, whose normalised
    # integral is the regularised incomplete beta I_{(1-rho0)/2}((1+c)/2, (1-c)/2).
    c = d / sigma**2
    rho0 = np.linspace(-0.95, 0.95, 7)
    got = antipodal_probability(rho0, 0.0, d=d, sigma=sigma, noise="tokens")
    want = betainc((1 + c) / 2, (1 - c) / 2, (1 - rho0) / 2)
    np.testing.assert_allclose(got, want, rtol=1e-8, atol=1e-12)


@pytest.mark.parametrize(
    "beta, d, sigma, noise, attention",
    [
        (1.0, 3, None, "values", "softmax"),
        (2.0, 8, None, "values", "softmax"),
        (4.0, 16, None, "values", "unnormalized"),
        (1.0, 3, 2.0, "tokens", "softmax"),
        (6.0, 3, 0.3, "tokens", "softmax"),
        (2.5, 4, 1.0, "tokens", "unnormalized"),
    ],
)
def test_scale_function_matches_an_independent_quadrature(
    beta, d, sigma, noise, attention
):
    # Different variable (z = atanh rho), different rule (trapezoid, no
    # singularity left), g rebuilt from the weights: agreement to the
    # trapezoid's ~1e-7.
    rho0 = np.array([-0.9, -0.3, 0.0, 0.5, 0.95])
    got = antipodal_probability(
        rho0, beta, d=d, sigma=sigma, noise=noise, attention=attention
    )
    want = [_probability_in_z(r, beta, d, sigma or 1.0, noise, attention) for r in rho0]
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-9)


def _generic_ito(x1, x2, beta, d, sigma, noise, attention):
    """b and a of rho = <x1, x2> from Ito's formula with the vectors themselves.

    Each token moves by mu_i dt + k_i, k_i = sqrt(rate) P_i G v_i with one
    standard Gaussian matrix G (v_i = y_i for values, x_i for tokens), so
    E[k_1 k_2^T] = rate (v_1 . v_2) P_1 P_2 dt; the Ito (normalisation) drift is
    -rate (d - 1)/2 |v_i|^2 x_i, and tokens add the projected attention drift.
    """
    rate = sigma**2 / d
    rho = x1 @ x2
    p, q = _weights(rho, beta, attention)
    y1, y2 = p * x1 + q * x2, p * x2 + q * x1
    proj1 = np.eye(d) - np.outer(x1, x1)
    proj2 = np.eye(d) - np.outer(x2, x2)
    v1, v2 = (y1, y2) if noise == "values" else (x1, x2)
    mu1 = -rate * (d - 1) / 2 * (v1 @ v1) * x1
    mu2 = -rate * (d - 1) / 2 * (v2 @ v2) * x2
    if noise == "tokens":
        mu1, mu2 = mu1 + proj1 @ y1, mu2 + proj2 @ y2
    b = x2 @ mu1 + x1 @ mu2 + rate * (v1 @ v2) * np.trace(proj1 @ proj2)
    # d rho's martingale part: x2^T k_1 + x1^T k_2.
    u1, u2 = proj1 @ x2, proj2 @ x1
    a = rate * (
        (u1 @ u1) * (v1 @ v1) + (u2 @ u2) * (v2 @ v2) + 2 * (u1 @ u2) * (v1 @ v2)
    )
    return b, a


@pytest.mark.parametrize("noise", ["values", "tokens"])
@pytest.mark.parametrize("attention", ["softmax", "unnormalized"])
def test_pair_coefficients_are_itos_formula(noise, attention):
    # The closed forms (simplified by hand) against Ito's formula evaluated on
    # random vectors in R^5 with the given inner product: rounding only.
    rng = np.random.default_rng(0)
    d, beta, sigma = 5, 1.3, 0.8
    for rho in (-0.97, -0.4, 0.0, 0.6, 0.99):
        basis, _ = np.linalg.qr(rng.standard_normal((d, d)))
        x1 = basis[:, 0]
        x2 = rho * basis[:, 0] + math.sqrt(1 - rho**2) * basis[:, 1]
        want = _generic_ito(x1, x2, beta, d, sigma, noise, attention)
        got = pair_coefficients(
            rho, beta, d=d, sigma=sigma, noise=noise, attention=attention
        )
        np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-14)


@pytest.mark.parametrize("d", [3, 4, 8, 30])
def test_values_threshold_is_cosh_two_beta_equal_d_minus_two(d):
    beta_c = antipodal_threshold(d=d)
    assert math.cosh(2 * beta_c) == pytest.approx(d - 2, rel=1e-14)
    # The Lyapunov exponent of log(1 + rho) at -1, b/(1+rho) - a/(2(1+rho)^2)
    # from the coefficients, changes sign there (independent of the scale code).
    eps = 1e-7

    def exponent(beta):
        b, a = pair_coefficients(-1 + eps, beta, d=d)
        return b / eps - a / (2 * eps**2)

    assert exponent(beta_c * 0.98 if beta_c else 0.0) > 0
    assert exponent(beta_c + 0.02) < 0
    # At and below: -1 does not attract, P = 0 exactly; just above, P > 0 and
    # small, growing with beta (the transition is continuous in P).
    below = [0.0, 0.5 * beta_c, beta_c]
    assert np.all(antipodal_probability(0.0, below, d=d) == 0)
    above = antipodal_probability(0.0, beta_c + np.array([1e-3, 0.1, 1.0]), d=d)
    assert 0 < above[0] < 1e-2 and np.all(np.diff(above) > 0)


def test_two_dimensions_have_no_threshold():
    assert antipodal_threshold(d=2) == -math.inf
    assert antipodal_probability(0.0, 0.0, d=2) == pytest.approx(0.5, rel=1e-10)


@pytest.mark.parametrize(
    "sigma, d, attention, beta_c",
    [
        (1.0, 3, "softmax", math.log(5) / 2),  # 2d/sigma^2 - 1 = 5
        (0.5, 2, "softmax", math.log(15) / 2),
        (3.0, 4, "softmax", -math.inf),  # sigma^2 >= 2d
        (1.0, 3, "unnormalized", math.log(3)),
        (2.0, 2, "unnormalized", math.log(0.5)),
    ],
)
def test_tokens_threshold(sigma, d, attention, beta_c):
    got = antipodal_threshold(d=d, sigma=sigma, noise="tokens", attention=attention)
    assert got == pytest.approx(beta_c, rel=1e-14)
    if math.isfinite(got) and got > 0:
        p = antipodal_probability(
            0.0,
            [got, got + 0.05],
            d=d,
            sigma=sigma,
            noise="tokens",
            attention=attention,
        )
        assert p[0] == 0 and p[1] > 0


def test_fixed_points_broadcasting_and_attention_invariance():
    # rho0 = -1 and 1 never move; "values" depends on the weights' ratio only.
    got = antipodal_probability([[-1.0], [1.0], [0.2]], [0.5, 2.0], d=5)
    assert got.shape == (3, 2)
    np.testing.assert_array_equal(got[:2], [[1, 1], [0, 0]])
    other = antipodal_probability(0.2, [0.5, 2.0], d=5, attention="unnormalized")
    np.testing.assert_allclose(got[2], other, rtol=1e-12)
    # sigma only rescales time in the values model.
    np.testing.assert_array_equal(
        antipodal_probability(0.2, 2.0, d=5, sigma=7.0), got[2, 1]
    )


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(d=1), "`d`"),
        (dict(d=2.5), "`d`"),
        (dict(d=3, noise="value"), "`noise`"),
        (dict(d=3, attention="l2"), "`attention`"),
        (dict(d=3, noise="tokens"), "`sigma`"),
        (dict(d=3, sigma=-1.0), "`sigma`"),
        (dict(d=3, beta=-0.1), "`beta`"),
        (dict(d=3, beta=math.inf), "`beta`"),
        (dict(d=3, rho0=1.5), "`rho0`"),
    ],
)
def test_bad_inputs_are_rejected(kwargs, match):
    args = dict(rho0=0.0, beta=1.0) | kwargs
    with pytest.raises(ValueError, match=match):
        antipodal_probability(**args)


def test_other_functions_reject_bad_inputs():
    with pytest.raises(ValueError, match="`rho`"):
        pair_coefficients(1.1, 1.0, d=3)
    with pytest.raises(ValueError, match="`sigma`"):
        antipodal_threshold(d=3, noise="tokens")
    with pytest.raises(ValueError, match="`d`"):
        antipodal_threshold(d=True)


# ---- Monte Carlo ---------------------------------------------------------------


def _z_coefficients(z, beta, d, sigma, noise, attention):
    """Drift and volatility of z = atanh(rho): bounded, so Euler-Maruyama is safe.

    dz = (b / (1 - rho^2) + rho a / (1 - rho^2)^2) dt + sqrt(a) / (1 - rho^2) dW
    (Ito), with b, a of `_generic_ito`'s closed forms rewritten per unit of
    (1 - rho^2): values rate((d-2) m + r rho), sqrt(2 rate r); tokens
    2q + rate rho, sqrt(2 rate).
    """
    rho = np.tanh(z)
    rate = sigma**2 / d
    p, q = _weights(rho, beta, attention)
    if noise == "values":
        m, r = 2 * p * q, p**2 + q**2
        return rate * ((d - 2) * m + r * rho), np.sqrt(2 * rate * r)
    return 2 * q + rate * rho, np.sqrt(2 * rate) + 0 * rho


def _mc_rho(rho0, beta, d, sigma, noise, attention, *, runs, t1, h, seed):
    rng = np.random.default_rng(seed)
    z = np.full(runs, np.arctanh(rho0))
    for _ in range(round(t1 / h)):
        drift, vol = _z_coefficients(z, beta, d, sigma, noise, attention)
        z = z + drift * h + vol * math.sqrt(h) * rng.standard_normal(runs)
    return z


@pytest.mark.parametrize(
    "rho0, beta, d, sigma, noise, attention",
    [
        (0.0, 1.0, 3, math.sqrt(3), "values", "softmax"),
        (0.3, 2.0, 8, math.sqrt(8), "values", "softmax"),
        (0.0, 1.0, 3, 2.0, "tokens", "softmax"),
        (-0.2, 2.0, 2, 1.0, "tokens", "unnormalized"),
    ],
)
def test_one_dimensional_monte_carlo(rho0, beta, d, sigma, noise, attention):
    # Euler-Maruyama in z = atanh(rho) (bounded coefficients), 4000 paths,
    # h = 0.01, to t = 30: the slowest exponent at a boundary is >= 0.3 here, so
    # |z| grows ~ 0.3 t and the undecided fraction is checked to be < 0.5 %.
    # Weak error O(h) ~ 1e-2 * O(1): below the 4 SE ~ 0.03 of 4000 runs.
    runs = 4000
    z = _mc_rho(
        rho0, beta, d, sigma, noise, attention, runs=runs, t1=30, h=0.01, seed=1
    )
    assert np.mean(np.abs(z) < 3) < 5e-3  # |rho| < 0.995: undecided
    estimate = np.mean(z < 0)
    want = float(
        antipodal_probability(
            rho0, beta, d=d, sigma=sigma, noise=noise, attention=attention
        )
    )
    se = math.sqrt(max(want * (1 - want), 1e-4) / runs)
    assert abs(estimate - want) < SE_FACTOR * se, (estimate, want, se)


def _sphere_values_mc(rho0, beta, d, *, runs, t1, h, seed):
    """The finite-depth Transformer of Fedorov et al.: x <- N(x + sqrt(h / d) G y).

    Two tokens, one Gaussian value matrix G per layer shared by both (sigma = 1:
    entries of variance h / d), softmax attention A = beta I, token-wise
    normalisation to the unit sphere. (G y_1, G y_2) is sampled exactly as a
    Gaussian pair with covariance [[|y1|^2, y1.y2], [y1.y2, |y2|^2]] (x) I_d.
    """
    rng = np.random.default_rng(seed)
    x1 = np.zeros((runs, d))
    x2 = np.zeros((runs, d))
    x1[:, 0] = 1.0
    x2[:, 0], x2[:, 1] = rho0, math.sqrt(1 - rho0**2)
    scale = math.sqrt(h / d)
    for _ in range(round(t1 / h)):
        rho = np.sum(x1 * x2, axis=1, keepdims=True)
        p, q = expit(beta * (1 - rho)), expit(-beta * (1 - rho))
        y1, y2 = p * x1 + q * x2, p * x2 + q * x1
        n1 = np.sqrt(np.sum(y1 * y1, axis=1, keepdims=True))
        c = np.sum(y1 * y2, axis=1, keepdims=True) / n1**2
        # G y2 = c G y1 + sqrt(|y2|^2 - c^2 |y1|^2) N', independent N'.
        e1 = rng.standard_normal((runs, d))
        e2 = rng.standard_normal((runs, d))
        rest = np.sqrt(np.maximum(np.sum(y2 * y2, 1, keepdims=True) - c**2 * n1**2, 0))
        g1 = n1 * e1
        g2 = c * g1 + rest * e2
        x1 = x1 + scale * g1
        x2 = x2 + scale * g2
        x1 /= np.linalg.norm(x1, axis=1, keepdims=True)
        x2 /= np.linalg.norm(x2, axis=1, keepdims=True)
    return np.sum(x1 * x2, axis=1)


@pytest.mark.slow
@pytest.mark.parametrize("rho0, beta, d", [(0.0, 1.0, 3), (0.0, 2.0, 8), (0.5, 1.5, 5)])
def test_two_tokens_on_the_sphere_values_model(rho0, beta, d):
    # The discrete normalised stack itself (depth L = t1 / h), not the 1-D
    # reduction: checks the reduction, the Ito drift of the normalisation and
    # the scale function together. 3000 runs, h = 5e-3 (rate sigma^2/d = 1/d,
    # so t1 = 30 d keeps the exponents' product with t as in the 1-D test).
    runs = 3000
    rho = _sphere_values_mc(rho0, beta, d, runs=runs, t1=30.0 * d, h=5e-3 * d, seed=2)
    assert np.mean(np.abs(rho) < 0.99) < 5e-3
    estimate = np.mean(rho < 0)
    want = float(antipodal_probability(rho0, beta, d=d))
    se = math.sqrt(want * (1 - want) / runs)
    assert abs(estimate - want) < SE_FACTOR * se, (estimate, want, se)


def test_below_the_threshold_no_run_ends_antipodal():
    # d = 8, beta = 0.6 < beta_c = 1.24: -1 repels, P = 0. 2000 paths of the
    # 1-D diffusion from rho0 = -0.5 all end at +1 (a positive P of even 0.5 %
    # would leave none there with probability e^{-10}).
    d = 8
    assert antipodal_probability(-0.5, 0.6, d=d) == 0
    z = _mc_rho(
        -0.5,
        0.6,
        d,
        math.sqrt(d),
        "values",
        "softmax",
        runs=2000,
        t1=40,
        h=0.02,
        seed=3,
    )
    assert np.all(z > 3)


def _final_tokens(sol):
    return sol.x[:, -1]


@pytest.mark.slow
def test_two_tokens_under_mf_common_noise():
    # `mf.simulate_ensemble(..., noise=mf.CommonNoise(sigma), key=k)` on the
    # sphere, 400 members: softmax A = beta I, V = I, d = 3, sigma = 1.5,
    # beta = 1.5, from orthogonal tokens, to t = 15. Euler-Maruyama (Ito; it
    # converges to the Stratonovich projection on the sphere) with dt = 0.02:
    # rate h = (sigma^2/d) h = 0.015, a weak error well inside 4 SE = 0.09. The
    # test can fail: were B's entries of variance t (not t/d), P would be 0.40,
    # not 0.27.
    import jax
    import jax.numpy as jnp

    import meanfield as mf

    d, sigma, beta, runs = 3, 1.5, 1.5, 400
    x0 = jnp.broadcast_to(jnp.eye(d)[:2], (runs, 2, d))
    x = mf.simulate_ensemble(
        jax.vmap(mf.Particles)(x0),
        mf.SoftmaxAttention(jnp.eye(d), A=beta * jnp.eye(d)),
        15.0,
        noise=mf.CommonNoise(sigma),
        key=jax.random.key(4),
        normalization="sphere",
        solver="euler",
        dt0=0.02,
        reduce=_final_tokens,
    )
    x = np.asarray(x)
    rho = np.sum(x[:, 0] * x[:, 1], axis=1)
    assert np.mean(np.abs(rho) < 0.99) < 0.01
    estimate = np.mean(rho < 0)
    want = float(antipodal_probability(0.0, beta, d=d, sigma=sigma, noise="tokens"))
    se = math.sqrt(want * (1 - want) / runs)
    assert abs(estimate - want) < SE_FACTOR * se, (estimate, want, se)
