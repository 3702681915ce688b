"""Linear theory of the uniform density on S^{d-1}: rates, thresholds, type change.

References: the closed forms written independently here with SciPy's Bessel
functions; Mun & Rosenzweig (arXiv 2606.05140) for K_#^{(d)} and beta_*^{(d)};
Bruno, Pasqualotto & Agazzi (ICLR 2025) for the fastest-growing degree.
"""

import numpy as np
import pytest
from scipy.optimize import brentq
from scipy.special import gamma, iv

from meanfield import density

DIMENSIONS = (2, 3, 4, 5, 7)


def _area(d):
    return 2 * np.pi ** (d / 2) / gamma(d / 2)


def _kappa(ell, beta, d):
    """Funk-Hecke eigenvalue of e^{beta t} on S^{d-1}."""
    return (2 * np.pi) ** (d / 2) * beta ** (1 - d / 2) * iv(ell + d / 2 - 1, beta)


@pytest.mark.parametrize("d", DIMENSIONS)
@pytest.mark.parametrize("attention", ["softmax", "unnormalized"])
def test_growth_rate_is_the_funk_hecke_rate(d, attention):
    # lambda_l = l (l + d - 2) (kappa_l / (beta Z_0) - sigma^2 / 2), Z_0 =
    # kappa_0 (softmax: the linearised 1 / Z) or |S^{d-1}| (unnormalised: the
    # uniform density's value), evaluated with SciPy's unscaled iv.
    ell = np.arange(0, 9)[:, None]
    beta = np.array([0.3, 2.0, 9.0, 40.0])
    for sigma in (0.0, 0.35):
        got = density.growth_rate(ell, beta, attention, sigma, d=d)
        scale = _kappa(0, beta, d) if attention == "softmax" else _area(d)
        want = (
            ell * (ell + d - 2) * (_kappa(ell, beta, d) / (beta * scale) - sigma**2 / 2)
        )
        np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-300)
    # The circle is d = 2 with its own closed form k^2 I_k / (beta I_0).
    if d == 2:
        np.testing.assert_allclose(
            density.growth_rate(ell, beta),
            ell**2 * iv(ell, beta) / (beta * iv(0, beta)),
            rtol=1e-12,
        )


@pytest.mark.parametrize("d", DIMENSIONS)
def test_critical_noise_zeroes_degree_one_and_is_mun_rosenzweigs_threshold(d):
    beta = np.array([0.1, 1.0, 4.0, 30.0])
    for attention in ("softmax", "unnormalized"):
        sigma_c = density.critical_noise(beta, attention, d=d)
        for b, s in zip(beta, sigma_c, strict=True):
            # At sigma_c degree 1 is neutral, every degree decays.
            scale = density.growth_rate(1, b, attention, 0.0, d=d)
            assert abs(density.growth_rate(1, b, attention, s, d=d)) < 1e-13 * scale
            assert density.fastest_mode(b, attention, s * (1 + 1e-9), d=d) == 0
            assert density.fastest_mode(b, attention, s * (1 - 1e-6), d=d) == 1
    # Unnormalised: 1 / sigma_c^2 = K_#^{(d)} = beta^{d/2} / (2^{d/2} Gamma(d/2)
    # I_{d/2}(beta)), Mun & Rosenzweig's linear-stability threshold.
    k_sharp = beta ** (d / 2) / (2 ** (d / 2) * gamma(d / 2) * iv(d / 2, beta))
    np.testing.assert_allclose(
        1 / density.critical_noise(beta, "unnormalized", d=d) ** 2, k_sharp, rtol=1e-12
    )
    # Softmax: sigma_c^2 = 2 I_{d/2} / (beta I_{d/2 - 1}).
    np.testing.assert_allclose(
        density.critical_noise(beta, d=d) ** 2,
        2 * iv(d / 2, beta) / (beta * iv(d / 2 - 1, beta)),
        rtol=1e-12,
    )


@pytest.mark.parametrize("d", DIMENSIONS)
def test_fastest_mode_is_the_argmax_of_the_rates(d):
    # Brute force over every degree up to 400 (beyond 4 sqrt(beta) + 4 the
    # rates are far below the peak).
    ell = np.arange(1, 400)
    for attention in ("softmax", "unnormalized"):
        for beta in (0.5, 3.0, 5.0, 9.0, 27.0, 150.0):
            for sigma in (0.0, 0.05, 0.2):
                rates = density.growth_rate(ell, beta, attention, sigma, d=d)
                want = int(ell[np.argmax(rates)]) if rates.max() > 0 else 0
                assert density.fastest_mode(beta, attention, sigma, d=d) == want


def test_fastest_mode_reproduces_the_published_three_clusters():
    # Bruno, Pasqualotto & Agazzi, fig. 4: beta = 5 on the circle gives a
    # 3-periodic state.
    assert density.fastest_mode(5.0) == 3


@pytest.mark.parametrize("d", range(2, 9))
def test_type_change_beta_is_mun_rosenzweigs_beta_star(d):
    # beta_*^{(d)}: I_{d/2+1}(beta) / I_{d/2}(beta) = 1/d, solved independently.
    want = brentq(
        lambda b: iv(d / 2 + 1, b) / iv(d / 2, b) - 1 / d, 0.1, 50.0, xtol=1e-15
    )
    got = density.type_change_beta("unnormalized", d=d)
    np.testing.assert_allclose(got, want, rtol=1e-13)
    # On either side: continuous below, discontinuous above.
    assert density.transition_type(0.9 * want, "unnormalized", d=d) == "continuous"
    assert density.transition_type(1.1 * want, "unnormalized", d=d) == "discontinuous"


@pytest.mark.parametrize("d", range(2, 9))
def test_softmax_transition_stays_continuous_in_every_dimension(d):
    # kappa > 0 over six decades of beta: no type change for softmax attention
    # (kappa ~ c_d / beta at large beta, c_2 = 2/3).
    assert density.type_change_beta("softmax", bracket=(1e-3, 1e3), d=d) is None
    for beta in (1e-3, 0.5, 5.0, 50.0, 1e4, 1e8):
        assert density.landau_coefficient(beta, "softmax", d) > 0


def test_landau_coefficient_at_d_2_is_the_circles():
    # The d-dimensional formula at d = 2 against the circle's closed forms.
    for beta in (0.01, 1.0, 2.4469, 7.0, 300.0):
        g1 = iv(1, beta) / iv(0, beta)
        q = iv(2, beta) / iv(1, beta)
        delta = 1 - g1
        np.testing.assert_allclose(
            density.landau_coefficient(beta, "unnormalized", 2),
            (1 - 2 * q) / (2 * (1 - q)),
            rtol=1e-10,
        )
        np.testing.assert_allclose(
            density.landau_coefficient(beta, "softmax", 2),
            delta * (1.5 - delta - delta * q / (2 * (1 - q))),
            rtol=1e-10,
        )


@pytest.mark.parametrize("bad", [1, 0, 2.5, True, "3", None])
def test_bad_dimension_is_refused_naming_d(bad):
    for call in (
        lambda: density.growth_rate(1, 2.0, d=bad),
        lambda: density.critical_noise(2.0, d=bad),
        lambda: density.fastest_mode(2.0, d=bad),
        lambda: density.landau_coefficient(2.0, d=bad),
        lambda: density.type_change_beta(d=bad),
    ):
        with pytest.raises(ValueError, match="`d`"):
            call()


@pytest.mark.parametrize("d", [2, 3, 4, 5, 7])
def test_funk_hecke_eigenvalues_are_the_quadrature_of_their_integral(d):
    # kappa_l = |S^{d-2}| int e^{beta t} P_l(t) (1 - t^2)^{(d-3)/2} dt, by SciPy's
    # adaptive quadrature (the endpoint singularity of d = 2 by the substitution
    # t = cos(phi)), against the closed form in Bessel functions.
    from scipy.integrate import quad

    from meanfield.density._funk_hecke import legendre, scaled_funk_hecke, sphere_area

    beta = 2.7
    for ell in (0, 1, 2, 5):

        def integrand(phi, ell=ell):
            t = np.cos(phi)
            return (
                np.exp(beta * t) * legendre(ell + 1, t, d)[ell] * np.sin(phi) ** (d - 2)
            )

        want = sphere_area(d - 1) * quad(integrand, 0, np.pi, epsabs=0, epsrel=1e-12)[0]
        got = scaled_funk_hecke(ell, beta, d) * np.exp(beta)
        np.testing.assert_allclose(got, want, rtol=1e-11)


def test_legendre_polynomials_are_chebyshev_legendre_and_orthogonal():
    from numpy.polynomial import chebyshev
    from numpy.polynomial import legendre as np_legendre

    from meanfield.density._funk_hecke import harmonic_dimension, legendre, sphere_area

    t = np.linspace(-1, 1, 41)
    for ell in range(6):
        basis = np.eye(6)[ell]
        np.testing.assert_allclose(
            legendre(6, t, 2)[ell], chebyshev.chebval(t, basis), atol=1e-14
        )
        np.testing.assert_allclose(
            legendre(6, t, 3)[ell], np_legendre.legval(t, basis), atol=1e-14
        )
    # d = 5: orthogonal for (1 - t^2), and the addition theorem's norm
    # int P_l^2 dy = |S^{d-1}| / N(d, l).
    nodes, weights = np.polynomial.legendre.leggauss(40)
    P = legendre(6, nodes, 5)
    gram = (P * weights * (1 - nodes**2)) @ P.T * sphere_area(4)
    np.testing.assert_allclose(
        gram, np.diag(sphere_area(5) / harmonic_dimension(np.arange(6), 5)), atol=1e-13
    )
    np.testing.assert_array_equal(harmonic_dimension(np.arange(4), 3), [1, 3, 5, 7])
