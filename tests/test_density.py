"""The mean-field density on the circle (`mf.density`).

The uniform density of tokens on S^1 with A = beta I, V = I is unstable: the mode
e^{ik theta} grows at lambda_k = k^2 I_k(beta) / (beta I_0(beta)) under softmax
attention and k^2 I_k(beta) / beta unnormalised (docs/math/density.md), and the
fastest-growing mode sets how many clusters emerge from noise (Geshkovski,
Letrouit, Polyanskiy & Rigollet, 2023; Bruno, Pasqualotto & Agazzi, 2025).
"""

import numpy as np
import pytest

from meanfield import density
from meanfield.density._circle import _kernel_coefficients, rate_of_change


def _normalised(rho):
    return rho / (rho.sum() * 2 * np.pi / rho.size)


def _modes(N, ks, eps, seed=None):
    """Uniform density plus eps cos(k theta + phase_k) for each k."""
    theta = density.cell_centres(N)
    phases = (
        np.zeros(len(ks))
        if seed is None
        else (np.random.default_rng(seed).uniform(0, 2 * np.pi, len(ks)))
    )
    rho = np.ones(N)
    for k, phase in zip(ks, phases, strict=True):
        rho = rho + eps * np.cos(k * theta + phase)
    return _normalised(rho)


@pytest.mark.parametrize(
    ("attention", "beta"), [("softmax", 10.0), ("unnormalized", 2.0)]
)
def test_the_scheme_grows_each_mode_at_the_bessel_rate(attention, beta):
    """The linearised scheme, mode by mode: d a_k / dt = lambda_k a_k."""
    N, eps = 512, 1e-7
    every = np.arange(1, 40)
    rates = density.growth_rate(every, beta, attention)
    ks = every[rates > 1e-2]  # 1-13 and 1-8: beyond, lambda_k is below 1e-2
    rho0 = _modes(N, ks, eps)
    cos_hat, sin_hat = _kernel_coefficients(N, beta, attention)
    rate = np.asarray(
        rate_of_change(rho0, cos_hat, sin_hat, softmax=attention == "softmax")
    )
    measured = (np.fft.rfft(rate)[ks] / np.fft.rfft(rho0)[ks]).real
    predicted = density.growth_rate(ks, beta, attention)
    # The scheme's rate is lambda_k sin(kh/2) / (kh/2) (the face difference of
    # the flux), 1 - (kh)^2 / 24 to leading order: 1e-3 at k = 13, N = 512.
    # Nonlinear terms are O(eps max lambda) against lambda_k.
    h = 2 * np.pi / N
    bound = (ks * h) ** 2 / 24 * 1.01 + 10 * eps * rates.max() / predicted
    np.testing.assert_array_less(np.abs(measured / predicted - 1), bound)


@pytest.mark.parametrize(
    ("attention", "beta", "t1"), [("softmax", 10.0, 4.0), ("unnormalized", 2.0, 2.0)]
)
def test_solved_growth_rates_match_the_bessel_formula_to_one_percent(
    attention, beta, t1
):
    N = 512
    # The modes that grow by a factor e^{1/2} or more: k = 2..8 and 1..4.
    every = np.arange(1, 40)
    ks = every[density.growth_rate(every, beta, attention) * t1 > 0.5]
    rho0 = _modes(N, ks, 1e-6)
    sol = density.simulate(
        rho0, t1, beta=beta, attention=attention, rtol=1e-12, atol=1e-14
    )
    assert sol.status == "success"
    amplitude = np.abs(np.fft.rfft(sol.rho, axis=-1))[:, ks]
    measured = np.log(amplitude[1] / amplitude[0]) / t1
    predicted = density.growth_rate(ks, beta, attention)
    np.testing.assert_array_less(np.abs(measured / predicted - 1), 0.01)


def test_mass_is_conserved_to_rounding_and_the_density_stays_positive():
    N = 512
    rho0 = _modes(N, np.arange(1, 40), 1e-3, seed=0)
    sol = density.simulate(rho0, 25.0, beta=30.0, saveat=np.linspace(0, 25, 26))
    assert sol.status == "success"
    np.testing.assert_allclose(sol.mass, 1, atol=1e-13)
    assert sol.rho[-1].max() > 10  # clusters formed: the test is not vacuous
    assert sol.lowest > -100 * 1e-8


def _clustered_unnormalized_run(N, **tolerances):
    """beta = 7 unnormalised from noise to t = 2: clusters 8 times the uniform
    density at N = 128, the cells between them emptied to 1e-118."""
    rho0 = _normalised(1 + 1e-3 * np.random.default_rng(0).standard_normal(N))
    return density.simulate(rho0, 2.0, beta=7.0, attention="unnormalized", **tolerances)


def test_the_density_stays_nonnegative_where_clusters_empty_the_circle():
    # Tsit5's steps are not convex combinations of Euler steps: this run went
    # to -8.6e-8 (120 cells) with status "success". Every accepted SSP step is
    # >= 0 exactly.
    sol = _clustered_unnormalized_run(128)
    assert sol.status == "success"
    assert sol.lowest >= 0
    assert sol.rho[-1].max() > 8 / (2 * np.pi)  # clustered: the test is not vacuous
    # The fluxes telescope: the mass moves only by rounding, ~eps per step (a
    # random walk over ~6e3 steps: 1e-15 measured).
    np.testing.assert_allclose(sol.mass, 1, rtol=0, atol=1e-13)


@pytest.mark.slow
def test_the_positive_steps_converge_to_the_semi_discrete_solution():
    """Against Dopri8 at rtol 1e-13 on the same semi-discrete scheme."""
    import diffrax as dfx
    import jax
    import jax.numpy as jnp

    N = 128
    rho0 = _normalised(1 + 1e-3 * np.random.default_rng(0).standard_normal(N))
    cos_hat, sin_hat = _kernel_coefficients(N, 7.0, "unnormalized")
    with jax.enable_x64(True):
        ref = dfx.diffeqsolve(
            dfx.ODETerm(lambda t, r, a: rate_of_change(r, cos_hat, sin_hat, False)),
            dfx.Dopri8(),
            0.0,
            2.0,
            None,
            jnp.asarray(rho0),
            stepsize_controller=dfx.PIDController(rtol=1e-13, atol=1e-13),
            max_steps=10**6,
        ).ys[-1]
    ref = np.asarray(ref)
    for tol, bound in ((1e-8, 1e-5), (1e-10, 1e-7)):
        sol = _clustered_unnormalized_run(N, rtol=tol, atol=tol)
        # The uniform state is unstable: local errors grow with the modes
        # (measured 1.9e-6 and 2.1e-8 relative to max rho, 100 tol and 200 tol).
        error = np.abs(sol.rho[-1] - ref).max() / ref.max()
        assert error < bound, (tol, error)


def test_the_fastest_growing_mode_wins_from_a_flat_spectrum():
    beta, N = 30.0, 512
    k_star = density.fastest_mode(beta)
    assert k_star == 8
    # Bruno, Pasqualotto & Agazzi (ICLR 2025, Fig. 4): 3 clusters at beta = 5.
    assert density.fastest_mode(5.0) == 3
    ks = np.arange(1, 64)
    sol = density.simulate(
        _modes(N, ks, 1e-8, seed=1),
        20.0,
        beta=beta,
        saveat=[0.0, 20.0],
        rtol=1e-10,
        atol=1e-14,
    )
    # Equal amplitudes at t = 0: at t = 20 each has grown by e^{20 lambda_k},
    # and lambda_8 = 0.726 beats lambda_7 = 0.715 and lambda_9 = 0.691.
    spectrum = np.abs(np.fft.rfft(sol.rho[-1]))[1:]
    assert np.argmax(spectrum) + 1 == k_star
    assert spectrum.max() < 0.05 * sol.rho[-1].sum()  # still nearly linear


@pytest.mark.parametrize("seed", [2, 3, 4])
def test_clusters_from_noise_number_about_the_fastest_mode(seed):
    beta, N = 30.0, 512
    rho0 = _normalised(1 + 1e-4 * np.random.default_rng(seed).standard_normal(N))
    sol = density.simulate(rho0, 30.0, beta=beta)
    assert sol.status == "success"
    # The neighbours of k* = 8 grow almost as fast (within 5 %): noise decides
    # among them.
    assert abs(density.count_clusters(sol.rho[-1]) - density.fastest_mode(beta)) <= 1


@pytest.mark.parametrize(
    ("N", "n"), [(512, 400), pytest.param(1024, 2000, marks=pytest.mark.slow)]
)
def test_density_follows_the_particles_in_w1(N, n):
    beta, t1 = 10.0, 4.0
    theta = density.cell_centres(N)
    rho0 = _normalised(np.exp(2 * np.cos(theta) + 0.5 * np.cos(3 * theta - 1)))
    ts = np.linspace(0, t1, 5)
    sol = density.simulate(rho0, t1, beta=beta, saveat=ts)
    particles = density.simulate_particles(
        density.sample_quantiles(rho0, n), t1, beta=beta, saveat=ts
    )
    theta_t = density.angles(particles.x)
    w1 = [density.circle_w1(sol.rho[i], theta_t[i]) for i in range(ts.size)]
    # At t = 0: the quantile sample's 2 pi / (4 n). Later: that, spread by the
    # flow, plus the finite-volume error, first order (h = 2 pi / N = 6e-3) only
    # at the density's extrema.
    np.testing.assert_allclose(w1[0], 2 * np.pi / (4 * n), rtol=1e-3)
    assert max(w1) < 2 * np.pi / (4 * n) + 0.1 * 2 * np.pi / N, w1


def test_circle_w1_closed_forms():
    N = 256
    uniform = np.full(N, 1 / (2 * np.pi))
    # Uniform against one point: the mean arc distance to it, pi / 2.
    assert abs(density.circle_w1(uniform, [1.0]) - np.pi / 2) < 1e-4
    # Against n equally spaced points: pi / (2 n).
    n = 10
    got = density.circle_w1(uniform, np.arange(n) * 2 * np.pi / n + 0.3)
    assert abs(got - np.pi / (2 * n)) < 1e-4
    # The uniform density's quantile sample is equally spaced.
    quantiles = density.sample_quantiles(uniform, 50)
    assert abs(density.circle_w1(uniform, quantiles) - np.pi / 100) < 1e-4


def test_density_simulate_rejects_bad_input():
    rho = np.full(16, 1 / (2 * np.pi))
    with pytest.raises(ValueError, match="`rho0`.*mass"):
        density.simulate(2 * rho, 1.0, beta=1.0)
    with pytest.raises(ValueError, match="`rho0`"):
        density.simulate(-rho, 1.0, beta=1.0)
    with pytest.raises(ValueError, match="`beta`"):
        density.simulate(rho, 1.0, beta=0.0)
    with pytest.raises(ValueError, match="`attention`"):
        density.simulate(rho, 1.0, beta=1.0, attention="l2")
    with pytest.raises(ValueError, match="`saveat`"):
        density.simulate(rho, 1.0, beta=1.0, saveat=[0.0, 2.0])
    with pytest.raises(ValueError, match="`t1`"):
        density.simulate(rho, -1.0, beta=1.0)


def test_unnormalized_density_refuses_a_beta_whose_field_overflows():
    # e^beta overflows float64 past beta = 709.8: the rows were all NaN, with
    # status "max_steps". Just below, the field is representable and runs.
    rho = np.full(16, 1 / (2 * np.pi))
    with pytest.raises(ValueError, match=r"`beta` = 800 is too large.*log_scale"):
        density.simulate(rho, 1.0, beta=800.0, attention="unnormalized")
    sol = density.simulate(rho, 1e-300, beta=700.0, attention="unnormalized")
    assert sol.status == "success"
    np.testing.assert_allclose(sol.rho[-1], rho, rtol=1e-13)  # uniform: at rest
    # The same model as tokens refuses the same beta (its field overflowed too).
    with pytest.raises(ValueError, match=r"`beta` = 800 is too large.*log_scale"):
        density.simulate_particles(
            np.zeros(3), 1.0, beta=800.0, attention="unnormalized"
        )


@pytest.mark.parametrize(
    "call, match",
    [
        # Before: diffrax's "Must have at least one checkpoint".
        (
            lambda rho: density.simulate(rho, 1.0, beta=1.0, max_steps=0),
            r"`max_steps` must be a positive integer; got 0",
        ),
        # Before: ZeroDivisionError.
        (
            lambda rho: density.circle_w1(rho, [1.0], resolution=0),
            r"`resolution` must be a positive integer; got 0",
        ),
        # Before: 2 angles, silently.
        (
            lambda rho: density.sample_quantiles(rho, 2.5),
            r"`n` must be a positive integer; got 2.5",
        ),
        # Before: an error naming `x`, which the caller never passed.
        (
            lambda rho: density.simulate_particles([0.1, np.nan], 1.0, beta=1.0),
            r"`theta` must be finite; got 1 NaN or inf",
        ),
    ],
)
def test_bad_arguments_are_named(call, match):
    with pytest.raises(ValueError, match=match):
        call(np.full(16, 1 / (2 * np.pi)))


def test_count_clusters_reads_arcs_above_the_level():
    N = 400
    theta = density.cell_centres(N)
    assert density.count_clusters(np.full(N, 1 / (2 * np.pi))) == 0
    # Three narrow bumps, one across the seam at theta = 0.
    rho = np.full(N, 1e-3)
    for centre in (0.0, 2.0, 4.0):
        arc = np.angle(np.exp(1j * (theta - centre)))
        rho += np.exp(-(arc**2) / (2 * 0.02**2))
    assert density.count_clusters(rho) == 3
    with pytest.raises(ValueError, match="`level`"):
        density.count_clusters(rho, level=1.0)


def test_a_temperature_beyond_scipys_bessel_range_still_solves():
    # SciPy's ive is NaN past beta ~ 2e9: the kernel's coefficients then come
    # from Debye's expansion, finite and conservative.
    N = 64
    theta = (np.arange(N) + 0.5) * 2 * np.pi / N
    rho0 = 1 + 0.1 * np.cos(theta)
    rho0 /= rho0.sum() * 2 * np.pi / N
    sol = density.simulate(rho0, 0.01, beta=3e9)
    assert sol.status == "success" and np.all(np.isfinite(sol.rho))
    np.testing.assert_allclose(sol.mass, 1.0, rtol=1e-13)
    # Above the critical noise (2.6e-5 here) the uniform state is the answer.
    # Uniform to rounding (order 3e-17, rho exact, measured).
    state = density.stationary(3e9, 1e-3, N=N)
    assert state.converged and state.order < 1e-14
    np.testing.assert_allclose(state.rho, 1 / (2 * np.pi), rtol=1e-14)
