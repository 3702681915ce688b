"""Stationary densities with noise and the phase transition on the circle.

References independent of the solver: the zero-flux equation by direct
quadrature and finite differences off the grid, the closed-form uniform free
energy, the Landau coefficient against the solved branch, Mun & Rosenzweig's
beta_* from SciPy's Bessel functions, and (slow) a long `simulate` run.
"""

import inspect

import numpy as np
import pytest
from scipy.optimize import brentq
from scipy.special import iv, ive

import meanfield as mf
from meanfield.density._stationary import Problem, _solves, stationary
from meanfield.density._transition import (
    cluster_branch,
    coexistence_noise,
    landau_coefficient,
    noise_continuation,
    transition_type,
    type_change_beta,
)

N = 512
critical_noise = mf.density.critical_noise


def interpolate(rho, theta):
    """The trigonometric interpolant of cell values rho at angles theta (NumPy).

    The Nyquist mode is left out: for a resolved state it is below rounding.
    """
    n = rho.size
    k = np.fft.fftfreq(n, 1 / n)
    coef = np.fft.fft(rho) / n
    coef[n // 2] = 0
    phase = np.exp(1j * np.outer(theta - np.pi / n, k))  # cell j is at (j + 1/2) h
    return (phase @ coef).real


def field(rho, theta, beta, attention):
    """v at angles theta by trapezoid sums over the cells, e^{beta cos} unscaled."""
    nodes = mf.density.cell_centres(rho.size)
    h = 2 * np.pi / rho.size
    diff = nodes[None, :] - theta[:, None]
    kernel = np.exp(beta * np.cos(diff))
    num = h * (kernel * np.sin(diff)) @ rho
    if attention == "softmax":
        return num / (h * kernel @ rho)
    return num


def critical_sigma_numpy(beta, attention):
    """sigma_c^2 = 2 max_k lambda_k / k^2 over k <= 40 (docs/math/density.md)."""
    k = np.arange(1, 41)
    lam = k**2 * iv(k, beta) / beta
    if attention == "softmax":
        lam = lam / iv(0, beta)
    return np.sqrt(2 * np.max(lam / k**2))


@pytest.mark.parametrize("attention", ["softmax", "unnormalized"])
@pytest.mark.parametrize("beta", [0.5, 4.0, 16.0])
def test_critical_sigma_is_the_largest_mode_ratio(beta, attention):
    # Closed form (mode 1) against the maximum over modes, both from scipy's iv.
    got = critical_noise(beta, attention)
    np.testing.assert_allclose(got, critical_sigma_numpy(beta, attention), rtol=1e-13)


def test_the_field_is_a_gradient_of_log_Z():
    # v = (1/beta) d/dtheta log Z (softmax), (1/beta) dZ/dtheta (unnormalised):
    # the identities behind the fixed point, on a lopsided smooth density.
    beta, n = 3.0, 256
    theta = mf.density.cell_centres(n)
    rho = np.exp(np.cos(theta) + 0.5 * np.sin(2 * theta))
    rho /= rho.sum() * 2 * np.pi / n
    at, d = np.linspace(0, 2 * np.pi, 17)[:-1], 1e-5
    h = 2 * np.pi / n

    def Z(x):
        return h * np.exp(beta * np.cos(theta[None, :] - x[:, None])) @ rho

    slope_log = (np.log(Z(at + d)) - np.log(Z(at - d))) / (2 * d)
    slope = (Z(at + d) - Z(at - d)) / (2 * d)
    # Central differences: error d^2 |f'''| / 6 ~ 1e-10 * beta^3, rounding 1e-16/d.
    np.testing.assert_allclose(
        field(rho, at, beta, "softmax"), slope_log / beta, atol=1e-8
    )
    np.testing.assert_allclose(
        field(rho, at, beta, "unnormalized"), slope / beta, atol=1e-8 * Z(at).max()
    )


@pytest.mark.parametrize(
    "attention, beta, ratio",
    [
        ("softmax", 4.0, 0.5),
        ("softmax", 4.0, 0.9),
        ("softmax", 16.0, 0.7),
        ("unnormalized", 4.0, 0.9),
        ("unnormalized", 16.0, 1.1),  # a metastable cluster above sigma_c
    ],
)
def test_stationary_density_has_zero_flux_off_the_grid(attention, beta, ratio):
    sigma = ratio * critical_noise(beta, attention)
    state = stationary(beta, sigma, attention, N=N)
    assert state.converged and state.stable and state.order > 0.1
    assert state.residual < 1e-10  # the solver's own FFT check
    # Independent: the interpolant at the cell faces (off the nodes), rho' by
    # central differences of steps 2d and d with Richardson's extrapolation, v by
    # direct trapezoid sums.
    faces = mf.density.cell_centres(N) + np.pi / N

    def central(d):
        ahead = interpolate(state.rho, faces + d)
        return (ahead - interpolate(state.rho, faces - d)) / (2 * d)

    d = 1e-3
    slope = (4 * central(d) - central(2 * d)) / 3
    flux = field(state.rho, faces, beta, attention) * interpolate(state.rho, faces)
    scale = 0.5 * sigma**2 * np.abs(slope).max()
    # Without extrapolation the error is d^2 |rho'''| / 6, 4e-5 relative for the
    # narrowest cluster here (unnormalised, beta = 16: |rho'''| ~ 250 |rho'|);
    # with it O(d^4 |rho^(5)|), measured 4e-9 there, 1e-10 elsewhere; rounding
    # adds 1e-16 / d = 1e-13.
    assert np.abs(0.5 * sigma**2 * slope - flux).max() <= 2e-8 * scale


def test_mass_one_even_and_centred():
    state = stationary(4.0, 0.6, "softmax", N=N)
    theta = state.theta
    np.testing.assert_allclose(state.rho.sum() * 2 * np.pi / N, 1, rtol=1e-13)
    np.testing.assert_array_equal(state.rho, state.rho[::-1])  # even about 0
    assert theta[np.argmax(state.rho)] < 0.1 or theta[np.argmax(state.rho)] > 6.2
    m = np.sum(state.rho * np.exp(1j * theta)) * 2 * np.pi / N
    np.testing.assert_allclose(abs(m), state.order, rtol=1e-13)


def test_initial_cluster_anywhere_is_centred_at_zero():
    theta = mf.density.cell_centres(N)
    initial = np.exp(5 * np.cos(theta - 2.0))  # a cluster at theta = 2
    got = stationary(4.0, 0.6, "softmax", N=N, initial=initial)
    want = stationary(4.0, 0.6, "softmax", N=N)
    # Same fixed point reached from two starts: Newton's tolerance 1e-12.
    np.testing.assert_allclose(got.rho, want.rho, rtol=1e-10, atol=1e-12)


def test_spectral_accuracy_in_the_grid():
    # The state is smooth: 64 cells give the order parameter of 512 to rounding.
    coarse = stationary(4.0, 0.6, "softmax", N=64)
    fine = stationary(4.0, 0.6, "softmax", N=N)
    np.testing.assert_allclose(coarse.order, fine.order, rtol=1e-11)


def test_residual_flags_an_unresolved_grid():
    # A sharp unnormalised cluster (width ~ 0.02) on 32 cells of width 0.2.
    sigma = 0.3 * critical_noise(16.0, "unnormalized")
    state = stationary(16.0, sigma, "unnormalized", N=32)
    assert state.residual > 1e-3 and not state.converged
    sweep = noise_continuation(16.0, [sigma, 2 * sigma], "unnormalized", N=32)
    assert sweep.residual > 1e-3 and not sweep.converged
    branch = cluster_branch(16.0, [0.3, 0.9], "unnormalized", N=32)
    assert not branch.converged.any()


def test_converged_is_decided_on_the_flux_residual():
    # Softmax at beta = 300, sigma = sigma_c / 2: a cluster of width ~0.03 on 64
    # cells of width 0.1. Newton meets its tolerance on the discrete fixed point;
    # the zero-flux equation is off by 1e5, far beyond any rounding.
    sigma = 0.5 * critical_noise(300.0)
    coarse = stationary(300.0, sigma, N=64)
    assert coarse.residual > 1e3 and not coarse.converged
    # 512 cells resolve it: residual ~1e-13, within 10 tol (1 + max|phi|).
    fine = stationary(300.0, sigma, N=512)
    assert fine.residual < 1e-11 and fine.converged and fine.stable


def test_converged_is_false_for_a_nan_residual_or_exponent():
    # Comparisons with NaN are False: no NaN reads as converged, and an infinite
    # exponent (a bound of inf) passes nothing.
    prob = Problem(4.0, "softmax", 64)
    phi = np.zeros(32)
    assert _solves(prob, 1e-14, phi, 1e-12)
    assert not _solves(prob, np.nan, phi, 1e-12)
    assert not _solves(prob, 1e-14, np.full(32, np.nan), 1e-12)
    assert not _solves(prob, 1e-14, np.full(32, np.inf), 1e-12)


@pytest.mark.parametrize(
    "attention, beta", [("softmax", 1.0), ("softmax", 4.0), ("unnormalized", 1.0)]
)
def test_above_threshold_only_the_uniform_state(attention, beta):
    # Continuous regime: above sigma_c every start, even a sharp cluster, ends
    # uniform (exactly 1 / (2 pi) to Newton's tolerance).
    sigma = 1.05 * critical_noise(beta, attention)
    theta = mf.density.cell_centres(N)
    for initial in [None, np.exp(20 * np.cos(theta)), 1 + np.cos(3 * theta)]:
        state = stationary(beta, sigma, attention, N=N, initial=initial)
        assert state.converged and state.stable
        assert state.order < 1e-10
        np.testing.assert_allclose(state.rho, 1 / (2 * np.pi), rtol=1e-10)


@pytest.mark.parametrize(
    "attention, beta", [("softmax", 1.0), ("softmax", 16.0), ("unnormalized", 1.0)]
)
def test_below_threshold_a_cluster_even_from_uniform(attention, beta):
    sigma = 0.95 * critical_noise(beta, attention)
    uniform = stationary(beta, sigma, attention, N=N, initial=np.ones(N))
    cluster = stationary(beta, sigma, attention, N=N)
    assert uniform.stable and cluster.stable and cluster.order > 0.2
    # Picard iterations leave the unstable uniform state to the same cluster.
    np.testing.assert_allclose(uniform.order, cluster.order, rtol=1e-10)


@pytest.mark.parametrize("attention, beta", [("softmax", 2.0), ("unnormalized", 1.0)])
def test_amplitude_grows_like_sqrt_of_distance_to_threshold(attention, beta):
    sigma_c = critical_noise(beta, attention)
    kappa = landau_coefficient(beta, attention)
    eps = np.array([1e-3, 4e-3])
    sigma = sigma_c * (1 - eps)
    order = np.array([stationary(beta, s, attention, N=N).order for s in sigma])
    # Landau: r^2 = (sigma_c^2 / sigma^2 - 1) / kappa (1 + O(r^2)), r^2 ~ eps.
    deviation = order / np.sqrt((sigma_c**2 / sigma**2 - 1) / kappa) - 1
    assert np.all(np.abs(deviation) < 10 * eps)
    # The correction is O(eps): 4x the distance, 4x the deviation (to 10 %).
    assert 3.6 < deviation[1] / deviation[0] < 4.4


@pytest.mark.parametrize("attention", ["softmax", "unnormalized"])
@pytest.mark.parametrize("beta", [0.5, 2.0, 4.0, 16.0])
def test_landau_coefficient_matches_the_solved_branch(beta, attention):
    # The branch at prescribed order parameters r (bordered Newton), Richardson
    # in r^2: kappa(r) = kappa + O(r^2), so (4 kappa(r) - kappa(2r)) / 3 leaves
    # O(r^4) = 1e-8 relative at r = 0.01.
    branch = cluster_branch(beta, [0.01, 0.02], attention, N=N)
    assert branch.converged.all()
    kappa_r = (branch.sigma_c**2 / branch.sigma**2 - 1) / branch.order**2
    numeric = (4 * kappa_r[0] - kappa_r[1]) / 3
    kappa = landau_coefficient(beta, attention)
    np.testing.assert_allclose(numeric, kappa, rtol=1e-6, atol=1e-9)
    # Supercritical branches are stable, subcritical ones unstable.
    assert np.all(branch.stable == (kappa > 0))


def test_unnormalised_closed_form():
    for beta in [0.3, 2.0, 9.0]:
        q = iv(2, beta) / iv(1, beta)
        want = (1 - 2 * q) / (2 * (1 - q))
        np.testing.assert_allclose(
            landau_coefficient(beta, "unnormalized"), want, rtol=1e-12
        )


def test_type_change_is_mun_rosenzweig_beta_star():
    # Mun & Rosenzweig (arXiv 2604.16288, 2606.05140): I_2 / I_1 = 1/2 on S^1.
    beta_star = brentq(lambda b: iv(2, b) / iv(1, b) - 0.5, 1.0, 5.0, xtol=1e-14)
    np.testing.assert_allclose(beta_star, 2.4469183112891, rtol=1e-12)
    # From the closed-form kappa: to Brent's tolerance (1e-14).
    np.testing.assert_allclose(type_change_beta("unnormalized"), beta_star, rtol=1e-12)
    # From the solved branch alone (no formula): kappa numeric to ~1e-8 and
    # d kappa / d beta ~ -0.3 put the root within ~1e-7 of beta_*.

    def kappa_numeric(beta):
        branch = cluster_branch(beta, [0.01, 0.02], "unnormalized", N=128)
        k = (branch.sigma_c**2 / branch.sigma**2 - 1) / branch.order**2
        return (4 * k[0] - k[1]) / 3

    root = brentq(kappa_numeric, 2.0, 3.0, xtol=1e-10)
    np.testing.assert_allclose(root, beta_star, rtol=1e-6)
    assert transition_type(2.0, "unnormalized") == "continuous"
    assert transition_type(3.0, "unnormalized") == "discontinuous"


def test_landau_coefficient_at_large_and_small_beta():
    # Above beta = 1e4 the O(1 / beta) differences 1 - gamma_1 and 1 - q come
    # from Debye's logarithms: no cancellation, at any beta (ive is NaN past 2e9).
    for beta in (3e9, 1e10, 1e15, 1e100, 1e300):
        # Softmax kappa = 2 / (3 beta) + O(beta^-3); unnormalised, from Hankel's
        # q = I_2 / I_1 = 1 - 3 / (2 beta) + 3 / (8 beta^2) + O(beta^-3),
        # kappa = 1 - 1 / (2 (1 - q)) = -beta / 3 + 11/12 + O(1 / beta).
        np.testing.assert_allclose(landau_coefficient(beta) * beta, 2 / 3, rtol=1e-13)
        np.testing.assert_allclose(
            landau_coefficient(beta, "unnormalized"), -beta / 3 + 11 / 12, rtol=1e-13
        )
        assert transition_type(beta) == "continuous"
        assert transition_type(beta, "unnormalized") == "discontinuous"
    # Across the switch to Debye's expansion, the same kappa (the ratios of ive
    # below it lose eps beta = 2e-12 relatively in 1 - gamma_1 and 1 - q, and so
    # about that in kappa; 6e-13 measured).
    below, above = (landau_coefficient(1e4 * (1 + e)) for e in (-1e-12, 1e-12))
    np.testing.assert_allclose(below, above, rtol=1e-11)
    # beta -> 0, with q = beta / 4 and 1 - gamma_1 = 1 - beta / 2 + O(beta^2):
    # kappa = 1/2 + beta / 8 (softmax), 1/2 - beta / 8 (unnormalised), down to
    # subnormal beta (O(beta^2) below rounding here).
    for beta in (5e-324, 1e-300, 1e-8):
        np.testing.assert_allclose(landau_coefficient(beta), 0.5 + beta / 8, rtol=1e-15)
        np.testing.assert_allclose(
            landau_coefficient(beta, "unnormalized"), 0.5 - beta / 8, rtol=1e-15
        )


def test_softmax_stays_continuous():
    assert type_change_beta("softmax") is None
    betas = np.geomspace(1e-2, 1e3, 60)
    kappa = np.array([landau_coefficient(b, "softmax") for b in betas])
    assert np.all(kappa > 0)
    # Large beta: kappa -> 2 / (3 beta) (Bessel asymptotics), relative O(1/beta).
    np.testing.assert_allclose(kappa[-1] * betas[-1], 2 / 3, rtol=5e-3)
    assert transition_type(100.0, "softmax") == "continuous"


@pytest.mark.parametrize(
    "attention, beta, hysteresis",
    [
        ("unnormalized", 4.0, True),
        ("unnormalized", 2.0, False),
        ("softmax", 16.0, False),
    ],
)
def test_hysteresis_exactly_where_discontinuous(attention, beta, hysteresis):
    sigma_c = critical_noise(beta, attention)
    # Grid points avoid sigma_c itself, where the fixed point is degenerate.
    sigmas = sigma_c * np.linspace(0.905, 1.105, 21)
    sweep = noise_continuation(beta, sigmas, attention, N=N)
    assert sweep.converged and sweep.residual < 1e-9
    assert sweep.sigma_c == sigma_c
    assert sweep.bistable.any() == hysteresis
    below = sigmas < sigma_c
    assert np.all(sweep.from_uniform[below] > 0.05)
    assert np.all(sweep.from_uniform[~below] < 1e-10)
    if hysteresis:
        # Two states at one noise: uniform from above, a cluster from below,
        # exactly between sigma_c and the fold of the branch (bordered Newton).
        fold = cluster_branch(beta, np.linspace(0.01, 0.95, 95), attention).fold
        inside = (sigmas > sigma_c) & (sigmas < fold)
        np.testing.assert_array_equal(sweep.bistable, inside)
        assert np.all(sweep.from_cluster[inside] > 0.5)
    else:
        np.testing.assert_allclose(sweep.from_uniform, sweep.from_cluster, atol=1e-9)


def test_free_energy_of_uniform_is_closed_form():
    beta, sigma = 2.0, 1.5  # above sigma_c = 1.22: uniform
    state = stationary(beta, sigma, "unnormalized", N=N)
    want = -0.5 * sigma**2 * np.log(2 * np.pi) - iv(0, beta) / (2 * beta)
    np.testing.assert_allclose(state.free_energy, want, rtol=1e-13)
    assert stationary(beta, sigma, "softmax", N=N).free_energy is None


def test_coexistence_noise_is_where_free_energies_cross():
    beta = 8.0
    sigma_c = critical_noise(beta, "unnormalized")
    sigma_star = coexistence_noise(beta, N=N)
    fold = cluster_branch(beta, np.linspace(0.01, 0.95, 95), "unnormalized").fold
    # Mun & Rosenzweig: K_c < K_# (K = 1 / sigma^2), i.e. sigma_* > sigma_c.
    assert sigma_c < sigma_star < fold
    state = stationary(beta, sigma_star, "unnormalized", N=N)  # a second solver
    uniform = -0.5 * sigma_star**2 * np.log(2 * np.pi) - iv(0, beta) / (2 * beta)
    assert state.order > 0.5
    # Brent's tolerance in r (1e-13) times dF/dr: rounding of F ~ 1e-15 |F|.
    np.testing.assert_allclose(state.free_energy, uniform, rtol=1e-11)
    # Continuous below beta_*: the transition is at sigma_c.
    assert coexistence_noise(2.0, N=64) == critical_noise(2.0, "unnormalized")


def test_unnormalised_at_large_beta_keeps_float64():
    # sigma_c ~ e^{beta/2}: the scale a e^beta is formed in logs.
    np.testing.assert_allclose(
        critical_noise(300.0, "unnormalized"),
        np.exp(150.0) * np.sqrt(2 * ive(1, 300.0) / 300.0),
        rtol=1e-13,  # exp of an argument ~150: its rounding, 150 eps, is relative
    )
    beta = 100.0
    sigma = 0.95 * critical_noise(beta, "unnormalized")  # 3.6e21
    state = stationary(beta, sigma, "unnormalized", N=1024)
    assert state.converged and state.stable and state.order > 0.999
    # A cluster of width ~ 0.02 resolved on cells of 0.006: rounding-level flux.
    assert state.residual < 1e-9
    assert np.isfinite(state.free_energy)


def test_bad_inputs():
    with pytest.raises(ValueError, match="beta"):
        stationary(0.0, 1.0)
    with pytest.raises(ValueError, match="sigma"):
        stationary(1.0, -1.0)
    with pytest.raises(ValueError, match="attention"):
        stationary(1.0, 1.0, "linear")
    with pytest.raises(ValueError, match="N"):
        stationary(1.0, 1.0, N=101)
    with pytest.raises(ValueError, match="initial"):
        stationary(1.0, 1.0, N=64, initial=np.ones(32))
    with pytest.raises(ValueError, match="initial"):
        stationary(1.0, 1.0, N=64, initial=-np.ones(64))
    with pytest.raises(ValueError, match="tol"):
        stationary(1.0, 1.0, tol=0.0)
    with pytest.raises(ValueError, match="max_iter"):
        stationary(1.0, 1.0, max_iter=0)
    with pytest.raises(ValueError, match="too large"):
        stationary(800.0, 1.0, "unnormalized")
    with pytest.raises(ValueError, match="sigma"):
        stationary(1.0, 1e-200)  # a^{-1} beyond float64
    with pytest.raises(ValueError, match="`sigma` must be a real number"):
        stationary(1.0, "big")
    with pytest.raises(ValueError, match="sigmas"):
        noise_continuation(1.0, [0.5, 0.4])
    with pytest.raises(ValueError, match="sigmas"):
        noise_continuation(1.0, [1e-200, 1.0])
    with pytest.raises(ValueError, match="orders"):
        cluster_branch(1.0, [0.5, 0.2])
    with pytest.raises(ValueError, match="orders"):
        cluster_branch(1.0, [0.5, 1.0])
    with pytest.raises(ValueError, match="bracket"):
        type_change_beta("softmax", bracket=(2.0, 1.0))
    with pytest.raises(ValueError, match="attention"):
        landau_coefficient(1.0, "linear")


@pytest.mark.slow
@pytest.mark.skipif(
    "sigma" not in inspect.signature(mf.density.simulate).parameters,
    reason="mf.density.simulate has no noise",
)
def test_simulate_with_noise_relaxes_to_the_stationary_state():
    # The finite-volume scheme is second order: its stationary state differs
    # from the spectral one by O(h^2), 4x less on twice the cells.
    beta, attention = 4.0, "softmax"
    sigma = 0.8 * critical_noise(beta, attention)
    errors = []
    for n in (128, 256):
        theta = mf.density.cell_centres(n)
        rho0 = 1 + 0.3 * np.cos(theta - 1.0)
        rho0 /= rho0.sum() * 2 * np.pi / n
        sol = mf.density.simulate(
            rho0,
            80.0,
            beta=beta,
            attention=attention,
            sigma=sigma,
            rtol=1e-10,
            atol=1e-10,
        )
        assert sol.status == "success"
        rho = sol.rho[-1]
        # Rotate the stationary state (centred at 0) to the run's direction.
        angle = np.angle(np.sum(rho * np.exp(1j * theta)))
        ours = stationary(beta, sigma, attention, N=n).rho
        k = np.fft.rfftfreq(n, 1 / n)
        ours = np.fft.irfft(np.fft.rfft(ours) * np.exp(-1j * k * angle), n=n)
        errors.append(np.abs(rho - ours).max() / ours.max())
    assert errors[1] < 2e-3
    assert 3 < errors[0] / errors[1] < 5
