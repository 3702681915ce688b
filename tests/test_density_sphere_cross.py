"""The zonal solver on S^{d-1} against the full S^2 solver on axially symmetric data.

Two independent discretisations of the same PDE: finite volumes in the angle to
the axis (`simulate_zonal`, second order) and spherical harmonics on a
Gauss-Legendre grid (`simulate_sphere`, spectral). On a zonal density they must
agree to the finite volumes' O(h^2) error, falling 4x per halving of h.
"""

import numpy as np
import pytest
from scipy.integrate import quad

from meanfield import density

BETA, T1 = 4.0, 1.0


def _profile(theta):
    """A smooth zonal density (unnormalised): a cap at the north pole and a belt.

    A function of t = cos(theta) (so smooth on the sphere, poles included).
    """
    t = np.cos(theta)
    return np.exp(2 * t) + 0.6 * np.exp(-4 * (t + 0.4) ** 2)


def _mass():
    return 2 * np.pi * quad(lambda th: _profile(th) * np.sin(th), 0, np.pi)[0]


def _zonal_rho0(N):
    """Exact cell averages of the normalised profile (mass 1 with zonal_volumes)."""
    edges = np.linspace(0, np.pi, N + 1)
    cell = [
        2 * np.pi * quad(lambda th: _profile(th) * np.sin(th), a, b)[0]
        for a, b in zip(edges[:-1], edges[1:], strict=True)
    ]
    return np.asarray(cell) / density.zonal_volumes(N, 3) / _mass()


def _grid_rho0(grid):
    """The profile at the nodes, normalised by the grid's quadrature."""
    rho = np.repeat(_profile(np.asarray(grid.theta))[:, None], grid.nlon, axis=1)
    return rho / np.sum(rho * np.asarray(grid.weights).reshape(grid.shape))


def _at_nodes(sol, theta_nodes):
    """The zonal solution at t1, linearly interpolated to the colatitudes (O(h^2))."""
    centres = (np.arange(sol.rho.shape[1]) + 0.5) * np.pi / sol.rho.shape[1]
    return np.interp(theta_nodes, centres, sol.rho[-1])


@pytest.mark.parametrize(
    "attention, sigma, t1",
    # Unnormalised attention moves ~e^beta / beta faster: a shorter horizon
    # keeps the density resolved at L = 32.
    [
        ("softmax", 0.0, T1),
        pytest.param("unnormalized", 0.0, 0.05, marks=pytest.mark.slow),
        ("softmax", 0.4, T1),
    ],
)
def test_zonal_and_full_sphere_solvers_agree_on_zonal_data(attention, sigma, t1):
    L = 32
    grid = density.sphere_grid(L)
    theta = np.asarray(grid.theta)
    rho0 = _grid_rho0(grid)
    tight = dict(rtol=1e-11, atol=1e-11)
    full = density.simulate_sphere(
        rho0, t1, beta=BETA, attention=attention, sigma=sigma, **tight
    )
    assert full.status == "success"
    # The full solution stays zonal: every ring constant to rounding.
    assert np.ptp(full.rho[-1], axis=1).max() < 1e-12 * full.rho[-1].max()
    reference = full.rho[-1][:, 0]
    errors = []
    for N in (128, 256):
        zonal = density.simulate_zonal(
            _zonal_rho0(N),
            t1,
            beta=BETA,
            d=3,
            attention=attention,
            sigma=sigma,
            **tight,
        )
        assert zonal.status == "success"
        errors.append(np.abs(_at_nodes(zonal, theta) - reference).max())
    scale = reference.max()
    # Second order: the difference falls ~4x per halving (measured 4.0 for the
    # three cases; the zonal solver's order is 1.84-1.95 with minmod), and at
    # N = 256 it is the finite volumes' O(h^2) error, 1.2-4.4e-4 of the peak
    # (the spectral solution's error is below 1e-10 at L = 32).
    assert errors[0] / errors[1] > 2.8
    assert errors[1] < 1e-3 * scale


@pytest.mark.slow  # 2.4 s: two solvers at tight tolerances
def test_measures_of_both_solvers_have_the_same_moments():
    # sol.measure(i) is the cross-check API: the same density as weighted atoms
    # from either solver has the same mean and second moment (to the zonal
    # discretisation), here about the north pole axis.
    L, N = 24, 512
    grid = density.sphere_grid(L)
    rho0 = _grid_rho0(grid)
    full = density.simulate_sphere(rho0, 0.5, beta=BETA, rtol=1e-10, atol=1e-10)
    zonal = density.simulate_zonal(
        _zonal_rho0(N), 0.5, beta=BETA, d=3, rtol=1e-10, atol=1e-10
    )
    a = full.measure(1)
    b = zonal.measure(1, axis=np.array([0.0, 0.0, 1.0]))
    mean_a = np.asarray(a.weights) @ np.asarray(a.x)
    mean_b = np.asarray(b.weights) @ np.asarray(b.x)
    np.testing.assert_allclose(mean_a, mean_b, atol=2e-5)
    second_a = np.einsum("i,ij,ik->jk", a.weights, a.x, a.x)
    second_b = np.einsum("i,ij,ik->jk", b.weights, b.x, b.x)
    np.testing.assert_allclose(second_a, second_b, atol=2e-5)


def _bumps(grid, centres, width=20.0):
    """A density of equal Gaussian-like bumps e^{width (<x, c> - 1)} at `centres`."""
    x = np.asarray(grid.nodes).reshape(grid.shape + (3,))
    rho = sum(np.exp(width * (x @ np.asarray(c, float) - 1)) for c in centres)
    return rho / np.sum(rho * np.asarray(grid.weights).reshape(grid.shape))


@pytest.mark.parametrize(
    "centres, want",
    [
        ([[0, 0, 1]], 1),  # on the north pole: the first ring wraps around it
        ([[0, 0, 1], [0, 0, -1]], 2),
        ([[1, 0, 0], [-1, 0, 0], [0, 1, 0], [0, 0, 1]], 4),
        # Across the date line phi = 0: one cluster, not two.
        ([[np.cos(0.02), np.sin(0.02), 0], [np.cos(0.02), -np.sin(0.02), 0]], 1),
        ([], 0),
    ],
)
def test_count_sphere_clusters_joins_the_date_line_and_the_poles(centres, want):
    grid = density.sphere_grid(24)
    rho = (
        _bumps(grid, centres)
        if centres
        else np.full(grid.shape, 1 / (4 * np.pi))  # uniform: none above 4x
    )
    assert density.count_sphere_clusters(rho) == want


def test_count_sphere_clusters_refuses_bad_input():
    with pytest.raises(ValueError, match="`rho`"):
        density.count_sphere_clusters(np.ones(5))
    with pytest.raises(ValueError, match="`level`"):
        density.count_sphere_clusters(np.ones((4, 8)), level=1.0)
    with pytest.raises(ValueError, match="`rho`"):
        density.count_sphere_clusters(np.full((4, 8), np.nan))
