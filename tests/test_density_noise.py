"""The noisy density on the circle (`mf.density` with sigma > 0).

Tokens with independent Brownian motions, d theta_i = v dt + sigma dW_i, have the
density equation d_t rho + d_theta(rho v) = (sigma^2 / 2) d_theta^2 rho (Mun &
Rosenzweig, arXiv 2604.16288). Linearised at the uniform state the mode
e^{ik theta} grows at lambda_k^0 - sigma^2 k^2 / 2, and every mode decays above
sigma_c = sqrt(2 I_1(beta) / (beta I_0(beta))) (softmax; docs/math/density.md).
"""

import math
from decimal import Decimal, localcontext

import diffrax as dfx
import jax
import jax.numpy as jnp
import numpy as np
import pytest
import scipy.integrate
import scipy.linalg
from scipy.optimize import brentq
from scipy.special import ive

from meanfield import density
from meanfield.density import _bessel
from meanfield.density._circle import _kernel_coefficients, rate_of_change
from meanfield.density._splitting import SplitHeatSSPRK43, _clip, heat, heat_rates


def _normalised(rho):
    return rho / (rho.sum() * 2 * np.pi / rho.size)


def _modes(N, ks, eps):
    theta = density.cell_centres(N)
    return _normalised(1 + eps * np.cos(np.multiply.outer(theta, ks)).sum(-1))


def _drift_rate_by_quadrature(k, beta, attention):
    """lambda_k^0 from the linearisation's integral, not from Bessel identities.

    N[e^{ik phi}] = i e^{ik theta} int e^{beta cos u} sin u sin(ku) du and
    Z = int e^{beta cos u} du / (2 pi): lambda_k = k N_k / (2 pi Z).
    """
    weight = np.exp(-beta)  # both integrals scaled by e^{-beta}: no overflow

    def sin_integral(u):
        return weight * np.exp(beta * np.cos(u)) * np.sin(u) * np.sin(k * u)

    numerator = scipy.integrate.quad(sin_integral, 0, 2 * np.pi, limit=200)[0]
    z = scipy.integrate.quad(
        lambda u: weight * np.exp(beta * np.cos(u)), 0, 2 * np.pi, limit=200
    )[0]
    if attention == "softmax":
        return k * numerator / z
    return k * numerator / (2 * np.pi * weight)


@pytest.mark.parametrize("attention", ["softmax", "unnormalized"])
def test_growth_rates_and_critical_noise_against_quadrature(attention):
    ks = np.arange(1, 7)
    for beta in (0.3, 2.0, 10.0):
        drift = [_drift_rate_by_quadrature(k, beta, attention) for k in ks]
        sigma = 0.7
        # quad on smooth periodic integrands: ~1e-13 relative.
        np.testing.assert_allclose(
            density.growth_rate(ks, beta, attention, sigma),
            np.asarray(drift) - 0.5 * sigma**2 * ks**2,
            rtol=1e-10,
            atol=1e-12,
        )
        # sigma_c^2 / 2 is the largest lambda_k^0 / k^2; the maximiser is k = 1.
        sigma_c = density.critical_noise(beta, attention)
        np.testing.assert_allclose(0.5 * sigma_c**2, drift[0], rtol=1e-10)
        at_threshold = density.growth_rate(ks, beta, attention, sigma_c)
        assert abs(at_threshold[0]) < 1e-12 * drift[0]  # lambda_1 = 0 to rounding
        assert np.all(at_threshold[1:] < 0)


def test_k_equals_one_maximises_the_rate_per_k_squared_for_every_beta():
    # I_k(beta) decreases in k (docs/math/density.md): checked on 7 decades.
    betas = np.logspace(-4, 3, 50)
    ks = np.arange(1, 200)
    for beta in betas:
        per_k2 = density.growth_rate(ks, beta) / ks**2
        assert np.argmax(per_k2) == 0
        assert np.all(np.diff(per_k2) <= 0)


def test_critical_noise_limits_shapes_and_fastest_mode():
    # beta -> 0: the Kuramoto model with coupling 1, sigma_c^2 = 2 D_c = 1.
    np.testing.assert_allclose(density.critical_noise(1e-8), 1.0, rtol=1e-8)
    # beta -> inf: I_1 / I_0 = 1 - 1/(2 beta) - 1/(8 beta^2) + O(beta^-3).
    beta = 1e4
    want = np.sqrt(2 / beta * (1 - 1 / (2 * beta) - 1 / (8 * beta**2)))
    np.testing.assert_allclose(density.critical_noise(beta), want, rtol=1e-11)
    grid = np.array([[0.5, 1.0, 4.0], [10.0, 30.0, 100.0]])
    got = density.critical_noise(grid)
    assert got.shape == (2, 3)
    np.testing.assert_array_equal(got[1, 0], density.critical_noise(10.0))
    assert isinstance(density.critical_noise(2.0), float)
    assert np.all(np.diff(got.ravel()) < 0)  # sharper attention: less noise needed
    # Unnormalised, in logs: finite far past e^beta's overflow (beta = 709.8).
    assert np.isfinite(density.critical_noise(1000.0, "unnormalized"))
    # The fastest mode moves down with noise (the maximiser of the rates by
    # quadrature over k <= 30), and is 0 once nothing grows.
    sigma_c = density.critical_noise(30.0)
    drift = np.array(
        [_drift_rate_by_quadrature(k, 30.0, "softmax") for k in range(1, 31)]
    )
    for f, k_star in ((0, 8), (0.5, 6), (0.9, 3), (0.99, 1)):
        rates = drift - 0.5 * (f * sigma_c) ** 2 * np.arange(1, 31) ** 2
        assert np.argmax(rates) + 1 == k_star
        assert density.fastest_mode(30.0, sigma=f * sigma_c) == k_star
    assert density.fastest_mode(30.0, sigma=sigma_c * (1 + 1e-9)) == 0
    assert density.fastest_mode(30.0, sigma=3.0) == 0


def _bessel_ratios(beta, ks):
    """I_k(beta) / I_0(beta) for integers ks >= 1, as Decimals of 40 digits.

    The ratios r_k = I_k / I_{k-1} solve r_k = 1 / (2k / beta + r_{k+1}): run
    downwards from r = 0 at K = max(ks) + 10 sqrt(beta) + 50, where I_K / I_k
    < e^{-50}, the error in r_k is below 1e-40 (I_k is the recurrence's minimal
    solution, which the downward direction keeps). No Bessel function is called.
    """
    with localcontext() as context:
        context.prec = 40
        two_over_beta = 2 / Decimal(beta)
        top = int(max(ks))
        ratio, ratios = Decimal(0), {}
        for k in range(top + int(10 * math.sqrt(beta)) + 50, 0, -1):
            ratio = 1 / (k * two_over_beta + ratio)
            if k <= top:
                ratios[k] = ratio
        gamma, gammas = Decimal(1), {}
        for k in range(1, top + 1):
            gamma *= ratios[k]
            gammas[k] = gamma
        return [gammas[int(k)] for k in ks]


def _bessel_ratio_by_quadrature(k, beta):
    """I_k(beta) / I_0(beta) by the trapezoid rule, for beta >= 1e3.

    gamma_k = int_0^pi e^{beta (cos u - 1)} cos(ku) du / (the same without cos);
    t = sqrt(2 beta) sin(u / 2) turns e^{beta (cos u - 1)} du into
    e^{-t^2} 2 dt / sqrt(2 beta - t^2). The integrand is even, smooth, and below
    1e-390 past |t| = 30 < sqrt(2 beta): the trapezoid rule with h = 0.05 is
    exact to rounding (its error is of order e^{-pi^2 / h^2}).
    """
    t = np.arange(-30.0, 30.0 + 0.025, 0.05)
    weight = np.exp(-t * t) / np.sqrt(2 * beta - t * t)
    angle = 2 * np.arcsin(t / np.sqrt(2 * beta))
    return np.sum(weight * np.cos(k * angle)) / np.sum(weight)


@pytest.mark.parametrize("beta", [3.0, 100.0, 9_999.0, 10_001.0, 1e5])
def test_rates_match_the_bessel_ratio_recurrence_in_40_digits(beta):
    ks = np.arange(1, int(4 * np.sqrt(beta)) + 5)
    beta_ = Decimal(beta)
    want = np.array([float(g / beta_) for g in _bessel_ratios(beta, ks)])
    got = density.growth_rate(ks, beta) / ks**2
    # SciPy's ive (beta <= 1e4) errs by up to 7e-14 in the tail k ~ 4 sqrt(beta)
    # near beta = 1e4; Debye's expansion above by 5e-15 (rounding of E_k ~ 8).
    rtol = 3e-13 if beta <= 1e4 else 3e-14
    np.testing.assert_allclose(got, want, rtol=rtol, atol=0)


def test_rates_beyond_scipys_range_match_the_recurrence_and_quadrature():
    # beta = 3e9: SciPy's ive returns NaN here (it overflows past ~2e9).
    beta = 3e9
    ks = np.array([1, 2, 10, round(math.sqrt(2 * beta)), round(2 * math.sqrt(beta))])
    want = [float(g / Decimal(beta)) for g in _bessel_ratios(beta, ks)]
    got = density.growth_rate(ks, beta) / ks**2
    np.testing.assert_allclose(got, want, rtol=3e-14, atol=0)
    # beta = 1e12, by quadrature at the fastest mode (gamma ~ e^{-1}): ~1e-15
    # (sums of 1200 terms, within a factor e of their absolute sums; 0 measured).
    beta, k = 1e12, 1_414_214
    want = _bessel_ratio_by_quadrature(k, beta) / beta
    np.testing.assert_allclose(density.growth_rate(k, beta) / k**2, want, rtol=1e-14)


def test_expansions_and_scipy_agree_where_both_hold():
    # At the switch beta = 1e4 Debye's first omitted term is below 0.113 / beta^4
    # = 1.1e-17 and ive is accurate to 1e-13; at 1e-5 the series' first omitted
    # term is below 1e-32 relatively. Either side of each, the same ratios.
    ks = np.arange(0.0, 405.0)
    beta = 1e4
    debye = np.exp(_bessel._debye_log_ratio(ks, beta))
    np.testing.assert_allclose(debye, ive(ks, beta) / ive(0, beta), rtol=2e-13)
    ks = np.arange(1.0, 6.0)
    for beta in (_bessel._SMALL_BETA * (1 - 1e-9), 1e-6):
        assert beta < _bessel._SMALL_BETA  # the series
        want = ive(ks, beta) / (beta * ive(0, beta))
        np.testing.assert_allclose(_bessel.rate(ks, beta), want, rtol=1e-13)


def test_large_beta_limits_of_the_rates_and_the_critical_noise():
    for beta in (3e9, 1e10, 1e15, 1e100, 1e300, 1.7e308):
        # I_1 / I_0 = 1 - 1/(2 beta) - 1/(8 beta^2) + O(beta^-3): to rounding here.
        gamma1 = 1 - 1 / (2 * beta) - 1 / (8 * beta) / beta
        np.testing.assert_allclose(
            density.critical_noise(beta), np.sqrt(2 / beta * gamma1), rtol=1e-15
        )
        np.testing.assert_allclose(
            density.growth_rate(1, beta), gamma1 / beta, rtol=1e-15
        )
    sigma_c = density.critical_noise(np.array([1e4, 1e8, 1e12, 1e200]))
    np.testing.assert_allclose(
        sigma_c, np.sqrt(2 / np.array([1e4, 1e8, 1e12, 1e200])), rtol=1e-4
    )
    # The fastest mode ~ sqrt(2 beta) = 1414213.56: the nearest integer, whose
    # rate beats its neighbour's by 1.2e-13 (500 ulps) relatively.
    beta = 1e12
    assert density.fastest_mode(beta) == 1_414_214
    # With sigma = f sigma_c, lambda_k ~ 2x (e^{-x} - f^2), x = k^2 / (2 beta):
    # largest at (1 - x) e^{-x} = f^2 (corrections O(1 / beta)).
    sigma_c = density.critical_noise(beta)
    for f in (0.3, 0.5, 0.9):
        x = brentq(lambda x, f=f: (1 - x) * np.exp(-x) - f**2, 0.0, 1.0, xtol=1e-15)
        got = density.fastest_mode(beta, sigma=f * sigma_c)
        assert abs(got - np.sqrt(2 * beta * x)) < 1
    assert density.fastest_mode(beta, sigma=sigma_c * (1 + 1e-9)) == 0
    # Beyond ~1e15 the neighbours' rates agree to rounding: within 1e-8.
    for beta in (1e20, 1e30):
        assert abs(density.fastest_mode(beta) / np.sqrt(2 * beta) - 1) < 1e-7


@pytest.mark.parametrize("beta", [5e-324, 1e-310, 1e-300, 1e-100, 1e-8])
def test_small_beta_limits_hold_down_to_subnormal_beta(beta):
    # sigma_c^2 = 1 - beta^2 / 8 + ..., lambda_1 = 1/2 (1 - beta^2 / 8 + ...): the
    # Kuramoto limit, to rounding for beta <= 1e-8.
    np.testing.assert_allclose(density.critical_noise(beta), 1.0, rtol=1e-15)
    np.testing.assert_allclose(density.growth_rate(1, beta), 0.5, rtol=1e-15)
    np.testing.assert_allclose(
        density.growth_rate(1, beta, "unnormalized"), 0.5, rtol=1e-15
    )
    assert density.fastest_mode(beta) == 1
    # lambda_k = k^2 (beta/2)^(k-1) / (2 k!) (1 + O(beta^2)), in 40 digits.
    ks = np.array([1, 2, 3])
    want = [
        float(int(k) ** 2 * g / Decimal(beta))
        for k, g in zip(ks, _bessel_ratios(beta, ks), strict=True)
    ]
    # Subnormal rates (k >= 2 at beta < 1e-307) have no relative precision.
    tiny = np.finfo(np.float64).tiny
    np.testing.assert_allclose(
        density.growth_rate(ks, beta), want, rtol=1e-14, atol=tiny
    )


@pytest.mark.parametrize("attention", ["softmax", "unnormalized"])
def test_fastest_mode_has_the_largest_rate_of_every_mode(attention):
    # The search (ternary, on a unimodal sequence) against all modes' rates.
    top = 2e4 if attention == "softmax" else 700.0
    for beta in np.geomspace(1e-3, top, 25):
        sigma_c = density.critical_noise(beta, attention)
        ks = np.arange(1, int(4 * np.sqrt(beta)) + 5)
        for f in (0.0, 0.3, 0.9, 0.999, 1 + 1e-9):
            rates = density.growth_rate(ks, beta, attention, f * sigma_c)
            got = density.fastest_mode(beta, attention, f * sigma_c)
            if rates.max() <= 0:
                assert got == 0
            else:  # the largest rate, to rounding (two may tie)
                assert rates[got - 1] >= rates.max() - 1e-13 * abs(rates.max())


def test_growth_rate_broadcasts_modes_against_an_array_of_beta():
    ks = np.arange(0, 6)[:, None]
    betas = np.array([1e-310, 0.5, 30.0, 1e5, 1e12])
    got = density.growth_rate(ks, betas, sigma=0.1)
    assert got.shape == (6, 5)
    want = [[density.growth_rate(k, b, sigma=0.1) for b in betas] for k in range(6)]
    np.testing.assert_allclose(got, want, rtol=1e-15, atol=0)
    assert np.all(got[0] == 0)  # the mass
    unnormalised = density.growth_rate(2, betas[:3], "unnormalized")
    want = [density.growth_rate(2, b, "unnormalized") for b in betas[:3]]
    np.testing.assert_allclose(unnormalised, want, rtol=1e-15, atol=0)


@pytest.mark.parametrize(
    ("call", "match"),
    [
        (lambda: density.growth_rate(1.5, 1.0), "`k` must hold integer mode"),
        (lambda: density.growth_rate(np.nan, 1.0), "`k` must hold integer mode"),
        (lambda: density.growth_rate("1", 1.0), "`k` must hold integer mode"),
        (lambda: density.growth_rate([1, 2, 3], [1.0, 2.0]), "must broadcast"),
        (lambda: density.growth_rate(1, "big"), "`beta` must be positive"),
        (lambda: density.growth_rate(1, [1.0, -1.0]), "`beta` must be positive"),
        (lambda: density.critical_noise("2.0"), "`beta` must be positive"),
        (lambda: density.growth_rate(1, 800.0, "unnormalized"), "`beta` = 800"),
        (lambda: density.fastest_mode([1.0, 2.0]), "`beta` must be a real number"),
        (lambda: density.fastest_mode(1e31), "`beta` must be at most 1e\\+30"),
        (lambda: density.fastest_mode(1.0, sigma="big"), "`sigma` must be a real"),
        (
            lambda: density.simulate(
                np.full(8, 1 / (2 * np.pi)), 1.0, beta=1.0, sigma="big"
            ),
            "`sigma` must be a real number",
        ),
        (
            lambda: density.simulate(
                np.full(8, 1 / (2 * np.pi)), 1.0, beta=1.0, sigma=np.array([0.1])
            ),
            "`sigma` must be a real number",
        ),
    ],
)
def test_bad_modes_and_betas_are_named(call, match):
    with pytest.raises(ValueError, match=match):
        call()


@pytest.mark.parametrize(
    ("call", "match"),
    [
        (lambda: density.critical_noise(0.0), "`beta` must be positive"),
        (lambda: density.critical_noise([1.0, np.nan]), "`beta` must be positive"),
        (lambda: density.critical_noise([]), "`beta` must be positive"),
        (lambda: density.critical_noise(1.0, "l2"), "`attention`"),
        (
            lambda: density.critical_noise(2000.0, "unnormalized"),
            "too large.*1431",
        ),
        (lambda: density.growth_rate(1, 1.0, sigma=-1.0), "`sigma` must be >= 0"),
        (lambda: density.fastest_mode(1.0, sigma=np.inf), "`sigma` must be >= 0"),
        (
            lambda: density.simulate(
                np.full(8, 1 / (2 * np.pi)), 1.0, beta=1.0, sigma=-0.1
            ),
            "`sigma` must be >= 0",
        ),
    ],
)
def test_bad_noise_arguments_are_named(call, match):
    with pytest.raises(ValueError, match=match):
        call()


def test_the_heat_step_is_the_exact_fourier_solution_to_second_order():
    sigma, t = 1.3, 0.1
    ks = np.array([1, 3, 7, 12])  # decays from 0.92 to e^-12
    errors = []
    for N in (256, 512):
        rho = _modes(N, ks, 0.1)
        got = np.fft.rfft(np.asarray(heat(rho, heat_rates(N, sigma), t)))[ks]
        want = np.fft.rfft(rho)[ks] * np.exp(-0.5 * sigma**2 * ks**2 * t)
        error = np.abs(got / want - 1)
        # The three-point Laplacian's symbol is k^2 (1 - (kh)^2 / 12 + ...), so
        # the mode decays by e^delta less, delta = (sigma^2 k^2 t / 2) (kh)^2 / 12.
        h = 2 * np.pi / N
        delta = 0.5 * sigma**2 * ks**2 * t * (ks * h) ** 2 / 12
        np.testing.assert_array_less(error, 1.01 * np.expm1(delta) + 1e-12)
        errors.append(np.log(np.abs(got / want)))  # delta (1 + O((kh)^2))
    # Second order: delta scales as h^2, to (kh)^2 / 30 < 0.3 %.
    np.testing.assert_allclose(errors[0] / errors[1], 4, rtol=0.01)


def test_the_heat_step_is_the_positive_semigroup_of_the_discrete_laplacian():
    N, sigma = 64, 0.8
    h = 2 * np.pi / N
    lap = -2 * np.eye(N) + np.roll(np.eye(N), 1, 0) + np.roll(np.eye(N), -1, 0)
    generator = 0.5 * sigma**2 * lap / h**2
    delta = np.zeros(N)
    delta[5] = 1 / h  # all the mass in one cell
    for t in (1e-6, 1e-3, 0.3):
        exact = scipy.linalg.expm(t * generator) @ delta
        assert exact.min() >= 0  # a Metzler generator: e^{tD} >= 0
        got = heat(delta, heat_rates(N, sigma), t)
        # The FFT's rounding: ~ eps log N of the largest value.
        np.testing.assert_allclose(got, exact, rtol=0, atol=1e-14 / h)
        clipped = np.asarray(_clip(got, delta))
        assert clipped.min() >= 0
        np.testing.assert_allclose(clipped.sum() * h, 1, rtol=0, atol=1e-15)


@pytest.mark.parametrize(
    ("attention", "beta", "sigma", "t1", "ks"),
    [
        ("softmax", 10.0, 0.5, 2.0, [1, 2, 3, 4, 5]),
        ("softmax", 10.0, 1.0, 1.0, [1, 2, 3, 4]),
        ("unnormalized", 2.0, 1.0, 1.0, [1, 2, 3]),
        # Both sides of the threshold: lambda_1 = +0.018 and -0.018.
        pytest.param(
            "softmax",
            1.0,
            0.98 * density.critical_noise(1.0),
            4.0,
            [1, 2],
            id="softmax-1.0-below-sigma_c",
        ),
        pytest.param(
            "softmax",
            1.0,
            1.02 * density.critical_noise(1.0),
            4.0,
            [1, 2],
            id="softmax-1.0-above-sigma_c",
        ),
    ],
)
def test_solved_growth_rates_with_noise_match_to_one_percent(
    attention, beta, sigma, t1, ks
):
    N, ks = 512, np.asarray(ks)
    predicted = density.growth_rate(ks, beta, attention, sigma)
    # Decays of at most e^-8 from 1e-6: well above the rounding of rho.
    assert np.all(np.abs(predicted) * t1 < 8)
    sol = density.simulate(
        _modes(N, ks, 1e-6),
        t1,
        beta=beta,
        attention=attention,
        sigma=sigma,
        rtol=1e-12,
        atol=1e-14,
    )
    assert sol.status == "success"
    amplitude = np.abs(np.fft.rfft(sol.rho, axis=-1))[:, ks]
    measured = np.log(amplitude[1] / amplitude[0]) / t1
    # The scheme's rate is lambda_k^0 s - (sigma^2 k^2 / 2) s^2, s = sinc(kh/2)
    # (docs/math/density.md): within 3e-4 here; coupling of modes is O(1e-6).
    np.testing.assert_array_less(np.abs(measured / predicted - 1), 0.01)
    assert np.all(np.sign(measured) == np.sign(predicted))


def test_large_noise_on_ten_thousand_cells_is_stable_positive_and_conservative():
    N, sigma, beta = 10_000, 3.0, 10.0
    rho0 = np.zeros(N)  # two narrow bumps; 9 970 empty cells
    rho0[:20] = 1
    rho0[5000:5010] = 1
    rho0 = _normalised(rho0)
    ts = [0.0, 0.01, 0.1, 1.0, 1.5]
    sol = density.simulate(rho0, 1.5, beta=beta, sigma=sigma, saveat=ts)
    assert sol.status == "success"
    assert sol.lowest >= 0  # exactly: the clip removes the FFT's rounding
    # A rounding per step (14 steps measured).
    np.testing.assert_allclose(sol.mass, 1, rtol=0, atol=1e-13)
    # An explicit diffusion step would need dt <= h^2 / sigma^2 = 4e-8: 4e7 steps.
    assert sol.num_steps < 100
    # Near uniform by t = 1, mode 1 decays at lambda_1 = I_1/(beta I_0) - 4.5;
    # mode 2 is then dominated by mode 1 squared, so only k = 1 is compared.
    a1 = np.abs(np.fft.rfft(sol.rho[-2:], axis=-1))[:, 1]
    measured = np.log(a1[1] / a1[0]) / 0.5
    np.testing.assert_allclose(
        measured, density.growth_rate(1, beta, sigma=sigma), rtol=1e-4
    )
    assert np.abs(sol.rho[-1] - 1 / (2 * np.pi)).max() < 1e-3


def test_clusters_with_small_noise_keep_mass_and_positivity():
    N = 1024
    rho0 = np.zeros(N)
    rho0[:4] = 1
    rho0[600:603] = 1
    sol = density.simulate(
        _normalised(rho0), 1.0, beta=30.0, sigma=0.2, saveat=np.linspace(0, 1, 5)
    )
    assert sol.status == "success"
    assert sol.lowest >= 0
    # The mass moves by rounding only (~eps per step over ~150 steps).
    np.testing.assert_allclose(sol.mass, 1, rtol=0, atol=1e-13)
    assert sol.sigma == 0.2
    assert "sigma=0.2" in repr(sol)


def test_vanishing_noise_gives_the_noiseless_solution():
    N = 512
    rho0 = _normalised(1 + 1e-3 * np.random.default_rng(0).standard_normal(N))
    ts = [0.0, 10.0, 20.0]
    quiet = density.simulate(rho0, 20.0, beta=30.0, saveat=ts)
    assert "sigma" not in repr(quiet)
    faint = density.simulate(rho0, 20.0, beta=30.0, sigma=1e-12, saveat=ts)
    # sigma^2 = 1e-24: the split steps differ from the transport alone by the
    # FFT's rounding, ~1e-16, grown by e^{lambda_8 t} <= 2e6 at t = 20.
    np.testing.assert_allclose(faint.rho, quiet.rho, rtol=0, atol=1e-9)


def test_the_split_scheme_converges_at_second_order_to_the_semi_discrete_solution():
    """Against Dopri8 on the unsplit semi-discrete system (explicit Laplacian)."""
    N, beta, sigma, t1 = 128, 10.0, 0.3, 1.0
    h = 2 * np.pi / N
    theta = density.cell_centres(N)
    rho0 = _normalised(
        np.exp(3 * np.cos(theta)) + 0.5 * np.exp(4 * np.cos(theta - 2.5))
    )
    cos_hat, sin_hat = _kernel_coefficients(N, beta, "softmax")

    def transport(t, rho, args):
        return rate_of_change(rho, cos_hat, sin_hat, True)

    def unsplit(t, rho, args):
        laplacian = (jnp.roll(rho, -1) - 2 * rho + jnp.roll(rho, 1)) / h**2
        return transport(t, rho, args) + 0.5 * sigma**2 * laplacian

    with jax.enable_x64(True):
        ref = dfx.diffeqsolve(
            dfx.ODETerm(unsplit),
            dfx.Dopri8(),
            0.0,
            t1,
            None,
            jnp.asarray(rho0),
            stepsize_controller=dfx.PIDController(rtol=1e-13, atol=1e-13),
            max_steps=10**5,
        ).ys[-1]
        solver = SplitHeatSSPRK43(jnp.asarray(heat_rates(N, sigma)))
        term = dfx.ODETerm(transport)

        @jax.jit
        def fixed_steps(dts):
            def one(rho, t_and_dt):
                t, dt = t_and_dt
                return solver.step(term, t, t + dt, rho, None, None, False)[0], None

            return jax.lax.scan(one, jnp.asarray(rho0), (jnp.cumsum(dts) - dts, dts))[0]

        errors = [
            float(jnp.abs(fixed_steps(jnp.full(n, t1 / n)) - ref).max())
            for n in (20, 40)
        ]
    # Strang splitting: global error C dt^2 (measured 2.6e-6, 6.4e-7); the
    # transport's own is third order, so the ratio is 4 to within a few %.
    np.testing.assert_allclose(errors[0] / errors[1], 4, rtol=0.05)
    sol = density.simulate(rho0, t1, beta=beta, sigma=sigma)
    assert sol.status == "success"
    # At the default tolerance 1e-8 the steps are ~0.01 (measured):
    # splitting error ~1e-7 of max rho = 0.45.
    assert np.abs(sol.rho[-1] - np.asarray(ref)).max() < 1e-6


def _euler_maruyama_order(n, beta, sigma, t1, dt, seed):
    """|mean e^{i theta}| (steps,) of n tokens, d theta = v dt + sigma dW, in NumPy.

    v(theta_i) = sum_j e^{beta cos(theta_i - theta_j)} sin(theta_j - theta_i) / Z_i,
    the softmax field of the empirical measure, in O(n^2) per step.
    """
    rng = np.random.default_rng(seed)
    theta = rng.uniform(0, 2 * np.pi, n)
    order = np.empty(int(round(t1 / dt)))
    for i in range(order.size):
        c, s = np.cos(theta), np.sin(theta)
        # e^{beta (cos(theta_i - theta_j) - 1)}: the constant cancels in N / Z.
        kernel = np.exp(beta * (np.outer(c, c) + np.outer(s, s) - 1))
        z, kc, ks = (kernel @ np.stack([np.ones(n), c, s], 1)).T
        velocity = (c * ks - s * kc) / z  # sum_j K_ij sin(theta_j - theta_i) / Z_i
        theta = theta + velocity * dt + sigma * np.sqrt(dt) * rng.standard_normal(n)
        order[i] = np.abs(np.mean(np.exp(1j * theta)))
    return order


@pytest.mark.slow
def test_tokens_order_below_the_critical_noise_and_not_above():
    """An independent particle simulation on both sides of sigma_c (beta = 1)."""
    n, beta, dt = 500, 1.0, 0.025
    sigma_c = density.critical_noise(beta)
    # Above: the uniform state is stable and |mean e^{i theta}| is a fluctuation.
    # Linearised, sqrt(n) mean e^{i theta} is complex Gaussian with E|.|^2 =
    # kappa = sigma^2 / (sigma^2 - sigma_c^2) = 2.45 at 1.3 sigma_c, so
    # P(sqrt(n) r > c) = e^{-c^2 / kappa}: 4e-7 at c = 6, at most ~1e-5 over the
    # ~20 correlation times (1 / (2 |lambda_1|) = 1.6) of the second half.
    above = _euler_maruyama_order(n, beta, 1.3 * sigma_c, 25.0, dt, seed=0)
    assert np.sqrt(n) * above[above.size // 2 :].max() < 6
    # Below: mode 1 grows at lambda_1 = 0.34 from r ~ n^{-1/2} and saturates by
    # t ~ 20 (measured); the mean-field stationary state has r = 0.9313.
    below = _euler_maruyama_order(n, beta, 0.5 * sigma_c, 40.0, dt, seed=0)
    late = below[int(0.75 * below.size) :].mean()
    assert late > 0.3
    N = 256
    theta = density.cell_centres(N)
    stationary = density.simulate(
        _normalised(1 + 0.05 * np.cos(theta)), 40.0, beta=beta, sigma=0.5 * sigma_c
    ).rho[-1]
    r_pde = np.abs(np.sum(stationary * np.exp(1j * theta)) * 2 * np.pi / N)
    # The tokens' r fluctuates by 0.006 (std, measured) with a correlation time
    # ~1: its mean over t in [30, 40] by ~0.002; plus Euler-Maruyama's O(dt) and
    # the O(1/n) finite-size biases (~1e-3 measured).
    assert abs(late - r_pde) < 0.02, (late, r_pde)
