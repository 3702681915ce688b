"""Zonal stationary densities with noise on S^{d-1} (`_zonal_stationary`)."""

import numpy as np
import pytest
from scipy.optimize import brentq
from scipy.special import ive

from meanfield import density
from meanfield.density import (
    critical_noise,
    landau_coefficient,
    noise_continuation_zonal,
    stationary,
    stationary_zonal,
)
from meanfield.density._funk_hecke import legendre, scaled_funk_hecke, sphere_area
from meanfield.density._zonal_stationary import (
    _flux_residual,
    kernel_modes,
    largest_eigenvalue,
    problem,
)
from meanfield.density._zonal_transition import _zonal_branch

ATTENTIONS = ("softmax", "unnormalized")


def beta_star(d: int) -> float:
    """Mun & Rosenzweig's beta_*^{(d)}: I_{d/2+1}(beta) / I_{d/2}(beta) = 1 / d."""
    return brentq(lambda b: ive(d / 2 + 1, b) / ive(d / 2, b) - 1 / d, 0.1, 50.0)


@pytest.mark.parametrize("d", [2, 3, 4, 7])
def test_kernel_has_the_funk_hecke_eigenvalues(d):
    # The exact zonal kernel (Bessel I_{(d-3)/2} in the transverse direction)
    # against the closed-form kappa_l: the rule integrates the entire integrand
    # spectrally, so agreement to rounding (1e-13 of kappa_0) on 64 nodes.
    beta = 6.0
    prob = problem(beta, "softmax", d, 64)
    P = legendre(12, prob.t, d)
    got = P @ prob.kernel.T  # row l: the kernel applied to P_l, at the nodes
    kappa = scaled_funk_hecke(np.arange(12), beta, d)
    np.testing.assert_allclose(got, kappa[:, None] * P, rtol=0, atol=1e-13 * kappa[0])
    assert prob.w.sum() == pytest.approx(sphere_area(d), rel=1e-14)


@pytest.mark.parametrize("attention", ATTENTIONS)
@pytest.mark.parametrize("ratio", [0.5, 0.95])
def test_d2_matches_the_circle(attention, ratio):
    # d = 2 is the circle's even state: both discretisations are spectrally
    # converged (128 nodes here, 512 cells there), order parameters agree to
    # ~1e-15; 1e-10 is the brief's target with margin.
    beta = 4.0
    sigma = ratio * critical_noise(beta, attention)
    want = stationary(beta, sigma, attention)
    got = stationary_zonal(beta, sigma, 2, attention)
    assert got.converged and got.stable
    assert abs(got.order - want.order) < 1e-10
    if attention == "unnormalized":
        assert got.free_energy == pytest.approx(want.free_energy, rel=1e-12)
    else:
        assert got.free_energy is None
    # The closed forms at d = 2 are the circle's.
    assert float(density.critical_noise(beta, attention, 2)) == pytest.approx(
        float(critical_noise(beta, attention)), rel=1e-14
    )
    assert density.landau_coefficient(beta, attention, 2) == pytest.approx(
        landau_coefficient(beta, attention), rel=1e-12
    )


@pytest.mark.parametrize("attention", ATTENTIONS)
@pytest.mark.parametrize("d", [3, 4])
def test_branch_near_threshold_has_the_landau_coefficient(attention, d):
    # sigma_c^2 / sigma^2 - 1 = c0 + kappa r^2 + mu r^4 fitted on the branch at
    # r = 0.01..0.06: the O(r^6) term is ~1e-8 there, so kappa is good to 1e-4
    # (measured 2e-5); 1% leaves margin, and the intercept is 0 to 1e-7.
    beta = 4.0
    prob = problem(beta, attention, d, 64)
    r = np.linspace(0.01, 0.06, 6)
    sigma, ok, lam = _zonal_branch(prob, r)
    assert ok.all()
    y = float(density.critical_noise(beta, attention, d)) ** 2 / sigma**2 - 1
    c0, kappa, _ = np.linalg.lstsq(np.stack([r**0, r**2, r**4], 1), y, rcond=None)[0]
    want = density.landau_coefficient(beta, attention, d)
    assert abs(c0) < 1e-7
    assert kappa == pytest.approx(want, rel=1e-2)
    # beta = 4 is above beta_*: softmax continuous (kappa > 0, stable branch),
    # unnormalised discontinuous (kappa < 0, the small-r branch unstable).
    if attention == "softmax":
        assert want > 0 and np.all(lam <= 1)
    else:
        assert want < 0 and np.all(lam > 1)


def test_residual_tells_a_solution_from_a_perturbed_one():
    beta, d = 4.0, 3
    sigma = 0.7 * float(density.critical_noise(beta, "softmax", d))
    state = stationary_zonal(beta, sigma, d)
    # Measured 4e-14 (the cosine series' derivative rounds to ~N eps).
    assert state.converged and state.residual < 1e-11
    prob = problem(beta, "softmax", d, 128)
    bumped = state.rho * (1 + 1e-3 * legendre(3, state.t, d)[2])
    bumped /= state.weights @ bumped
    # The bump changes d rho/d theta by ~1e-3 max rho; Z barely moves.
    assert _flux_residual(prob, bumped, sigma) > 1e-4
    # An exact stationary state: the uniform density, to rounding.
    uniform = np.full(128, 1 / sphere_area(d))
    assert _flux_residual(prob, uniform, sigma) < 1e-12


def test_unresolved_grid_is_not_converged():
    # Unnormalised, beta = 8, sigma = 0.3 sigma_c: the cluster needs ~384
    # nodes (measured residual 0.42 on 128, 2e-7 on 256, 6e-12 on 384).
    beta = 8.0
    sigma = 0.3 * float(density.critical_noise(beta, "unnormalized", 3))
    coarse = stationary_zonal(beta, sigma, 3, "unnormalized", N=128)
    assert not coarse.converged and coarse.residual > 1e-3
    fine = stationary_zonal(beta, sigma, 3, "unnormalized", N=384)
    assert fine.converged and fine.residual < 1e-10


@pytest.mark.parametrize("attention", ATTENTIONS)
@pytest.mark.parametrize("d", [3, 4])
def test_uniform_state_is_stable_exactly_above_threshold(attention, d):
    beta = 4.0
    sigma_c = float(density.critical_noise(beta, attention, d))
    prob = problem(beta, attention, d, 128)
    uniform = prob.uniform()
    for ratio in (0.9, 1.1):
        sigma = ratio * sigma_c
        # The degree-1 gain of the linearised map at the uniform state is
        # (sigma_c / sigma)^2: its largest eigenvalue, to rounding.
        im = prob.image(uniform, prob.scale(sigma))
        lam = largest_eigenvalue(prob.jacobian(im))
        assert lam == pytest.approx(ratio**-2, rel=1e-12)
        start = np.full(128, 1.0)
        state = stationary_zonal(beta, sigma, d, attention, initial=start)
        assert state.converged and state.stable
        if ratio > 1:  # the uniform state itself, kept
            assert state.order < 1e-12
        else:  # left along degree 1 for the clustered state
            assert state.order > 0.1


def test_unnormalized_d3_hysteresis_above_beta_star_only():
    d = 3
    b_star = beta_star(d)
    assert density.landau_coefficient(b_star, "unnormalized", d) == pytest.approx(
        0, abs=1e-12
    )
    # Above beta_*: the branch folds back to sigma_fold > sigma_c (measured
    # 1.124 sigma_c at beta = 4); between them both states are stable.
    beta = 4.0
    sigma_c = float(density.critical_noise(beta, "unnormalized", d))
    ratios = np.array([0.9, 1.02, 1.06, 1.1, 1.14, 1.2])
    sweep = noise_continuation_zonal(beta, ratios * sigma_c, d, "unnormalized")
    assert sweep.converged
    np.testing.assert_array_equal(sweep.bistable, [0, 1, 1, 1, 0, 0])
    r = np.linspace(0.4, 0.9, 26)
    sigma, ok, _ = _zonal_branch(problem(beta, "unnormalized", d, 128), r)
    fold = sigma[ok].max()
    assert 1.1 < fold / sigma_c < 1.14
    # Below beta_*: continuous, no hysteresis even close to sigma_c.
    beta = 0.7 * b_star
    sigma_c = float(density.critical_noise(beta, "unnormalized", d))
    ratios = np.array([0.9, 0.97, 0.99, 1.005, 1.01, 1.03])
    sweep = noise_continuation_zonal(beta, ratios * sigma_c, d, "unnormalized")
    assert sweep.converged
    assert not sweep.bistable.any()
    assert np.all(sweep.from_cluster[ratios > 1] < 1e-8)
    assert np.all(sweep.from_cluster[ratios < 1] > 0.05)


def test_softmax_d3_is_continuous():
    # kappa > 0 on beta in [0.01, 700] (measured min 2.6e-3 at 700, kappa ~
    # 1.8 / beta there): the transition is continuous at every beta.
    betas = np.geomspace(0.01, 700, 60)
    kappas = np.array([density.landau_coefficient(b, "softmax", 3) for b in betas])
    assert np.all(kappas > 0)
    for beta in (1.0, 4.0, 16.0):
        sigma_c = float(density.critical_noise(beta, "softmax", 3))
        kappa = density.landau_coefficient(beta, "softmax", 3)
        # The noise at which the branch has r = 0.1 to leading order. (Closer
        # to sigma_c the uniform state's growth factor 1 + kappa r^2 is so
        # near 1 that the Picard iterations leaving it exceed max_iter.)
        near = sigma_c / np.sqrt(1 + kappa * 0.1**2)
        sigmas = np.array([0.6 * sigma_c, near, 1.05 * sigma_c, 1.3 * sigma_c])
        sweep = noise_continuation_zonal(beta, sigmas, 3, "softmax")
        assert sweep.converged and not sweep.bistable.any()
        # O(r^3) corrections: a few % of r at r = 0.1.
        assert sweep.from_uniform[1] == pytest.approx(0.1, rel=0.05)
        assert np.all(sweep.from_uniform[2:] < 1e-8)


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(d=1), "`d`"),
        (dict(d=2.5), "`d`"),
        (dict(d=True), "`d`"),
        (dict(d="3"), "`d`"),
        (dict(sigma=0.0), "`sigma`"),
        (dict(sigma=-1.0), "`sigma`"),
        (dict(beta=0.0), "`beta`"),
        (dict(N=7), "`N`"),
        (dict(N=16, beta=30.0), "`N` = 16 is too small for `beta`"),
        (dict(attention="hardmax"), "`attention`"),
        (dict(initial=np.ones(5)), "`initial`"),
        (dict(initial=-np.ones(64)), "`initial`"),
        (dict(tol=0.0), "`tol`"),
    ],
)
def test_bad_inputs_name_the_argument(kwargs, match):
    args = dict(beta=4.0, sigma=0.5, d=3, N=64) | kwargs
    with pytest.raises(ValueError, match=match):
        stationary_zonal(**args)


def test_bad_sigmas_name_the_argument():
    with pytest.raises(ValueError, match="`sigmas`"):
        noise_continuation_zonal(4.0, [0.5, 0.4], 3)
    with pytest.raises(ValueError, match="`d`"):
        noise_continuation_zonal(4.0, [0.4, 0.5], 0)


def test_kernel_modes_grow_like_sqrt_beta():
    # The fewest nodes accepted; measured 24 at beta = 4, 155 at 300.
    assert kernel_modes(4.0, 3) == 24
    assert kernel_modes(300.0, 3) == 155
    stationary_zonal(300.0, 0.05, 3, N=155, max_iter=1)  # accepted


@pytest.mark.slow
def test_unnormalized_d3_beta8_loop_ends_at_the_fold():
    # The cluster swept up from small noise disappears at the fold of the
    # branch (1.406 sigma_c measured), to the sweep's spacing.
    beta, d, N = 8.0, 3, 384
    sigma_c = float(density.critical_noise(beta, "unnormalized", d))
    ratios = np.linspace(0.3, 1.5, 25)
    sweep = noise_continuation_zonal(beta, ratios * sigma_c, d, "unnormalized", N=N)
    assert sweep.converged
    r = np.linspace(0.6, 0.95, 36)
    sigma, ok, _ = _zonal_branch(problem(beta, "unnormalized", d, N), r)
    fold = sigma[ok].max()
    last = sweep.sigma[sweep.from_cluster > 0.1].max()
    assert last <= fold < last + 0.05 * sigma_c
    assert sweep.bistable[(sweep.sigma > sigma_c) & (sweep.sigma < last)].all()
