"""The zonal density solver on S^{d-1} (meanfield/density/_zonal.py)."""

import jax.random as jr
import numpy as np
import pytest
import scipy.linalg
from scipy.special import gamma, iv

import meanfield as mf
from meanfield.density import (
    sample_zonal,
    simulate_zonal,
    zonal_angles,
    zonal_volumes,
    zonal_w1,
)
from meanfield.density._circle import simulate as simulate_circle
from meanfield.density._funk_hecke import legendre, sphere_area
from meanfield.density._zonal import _grid
from meanfield.density._zonal_grid import cap_fraction
from meanfield.density._zonal_heat import clip_mass, heat, heat_operator

EPS = np.finfo(np.float64).eps


def cell_averages(f, N: int, d: int) -> np.ndarray:
    """Averages (N,) of f(theta) over the cells for the measure sin^{d-2} dtheta."""
    x, w = np.polynomial.legendre.leggauss(20)
    p = (np.arange(N)[:, None] + 0.5 * (x + 1)) * (np.pi / N)
    s = np.sin(p) ** (d - 2)
    return (f(p) * s) @ w / (s @ w)


def normalised(rho: np.ndarray, d: int) -> np.ndarray:
    return rho / (rho @ zonal_volumes(rho.size, d))


def smooth(N: int, d: int) -> np.ndarray:
    """A smooth non-symmetric initial density (its extrema away from the poles)."""
    return normalised(
        cell_averages(lambda t: np.exp(1.5 * np.cos(t) + 0.8 * np.cos(3 * t)), N, d), d
    )


def coarsen(rho: np.ndarray, d: int) -> np.ndarray:
    """Cell averages on N / 2 cells of cell values on N (mass-exact)."""
    m = (rho * zonal_volumes(rho.size, d)).reshape(-1, 2).sum(1)
    return m / zonal_volumes(rho.size // 2, d)


def test_volumes_are_exact():
    # Gauss quadrature of an entire function in each cell: the cap fractions
    # (incomplete beta) agree to rounding, and the volumes sum to |S^{d-1}|.
    for d in (2, 3, 4, 7):
        V = zonal_volumes(50, d)
        F = cap_fraction(np.arange(51) * np.pi / 50, d)
        # atol: 1 - F loses ulps of 1 in the small caps around the south pole.
        np.testing.assert_allclose(
            V / sphere_area(d), np.diff(F), rtol=1e-12, atol=1e-15
        )
        assert abs(V.sum() / sphere_area(d) - 1) < 1e-14


@pytest.mark.parametrize("sigma", [0.0, 0.1])
def test_mass_and_positivity_through_clustering(sigma):
    N, d = 128, 3
    th = (np.arange(N) + 0.5) * np.pi / N
    rho0 = normalised(1 + 0.1 * np.cos(3 * th), d)
    sol = simulate_zonal(rho0, 15.0, beta=6.0, d=d, sigma=sigma, saveat=[0, 5, 15])
    assert sol.status == "success"
    # The fluxes telescope and the heat step restores the mass: what is left is
    # rounding, ~eps per step in a random walk over ~1e3 steps.
    assert np.max(np.abs(sol.mass - 1)) <= 1e-13
    assert sol.lowest >= 0  # exactly: the positive steps and the clip
    # It did cluster: the peak is > 20 times the uniform density 1 / |S^2|.
    assert sol.rho[-1].max() > 20 / sphere_area(d)


@pytest.mark.parametrize(
    "d, sigma",
    # With noise: second tier (3 s); its order is also in the benchmark.
    [(3, 0.0), pytest.param(3, 0.2, marks=pytest.mark.slow), (4, 0.0)],
)
def test_convergence_order(d, sigma):
    # rho at t = 1 on N, 2N, 4N cells; L1 differences of the cell averages.
    sols = [
        simulate_zonal(
            smooth(N, d), 1.0, beta=4.0, d=d, sigma=sigma, rtol=1e-10, atol=1e-10
        ).rho[-1]
        for N in (64, 128, 256)
    ]
    e1 = np.abs(sols[0] - coarsen(sols[1], d)) @ zonal_volumes(64, d)
    e2 = np.abs(sols[1] - coarsen(sols[2], d)) @ zonal_volumes(128, d)
    # MUSCL is second order; minmod drops to first order on O(h) sets around
    # the extrema, so the L1 order measures 1.84-1.95, not 2.
    assert np.log2(e1 / e2) > 1.75


def test_d2_matches_the_circle():
    # d = 2 is the circle, rho mirrored to 2N cells: the same fluxes and
    # limiter; the circle evaluates Z by the midpoint rule of the cells (FFT),
    # the zonal solver exactly for piecewise-constant cells, an O(h^2)
    # difference (4.5e-4 and 1.2e-4 in L1 at N = 64, 128, measured), 10 times
    # below the discretisation error (N vs 2N: 5.6e-3).
    diffs = []
    for N in (64, 128):
        r = smooth(N, 2)
        z = simulate_zonal(r, 1.0, beta=4.0, d=2, rtol=1e-10, atol=1e-10).rho[-1]
        c = simulate_circle(
            np.concatenate([r, r[::-1]]), 1.0, beta=4.0, rtol=1e-10, atol=1e-10
        ).rho[-1]
        # The circle keeps the mirror symmetry to rounding.
        np.testing.assert_allclose(c[:N], c[N:][::-1], atol=1e-13)
        diffs.append(np.abs(z - c[:N]) @ zonal_volumes(N, 2))
        if N == 64:
            z2 = simulate_zonal(
                smooth(128, 2), 1.0, beta=4.0, d=2, rtol=1e-10, atol=1e-10
            ).rho[-1]
            disc = np.abs(z - coarsen(z2, 2)) @ zonal_volumes(64, 2)
            assert diffs[0] < 0.2 * disc
    assert diffs[1] < diffs[0] / 3  # second order: a factor 4 per halving


def linear_rate(ell, d, beta, sigma, attention):
    """Growth rate of P_l around the uniform density (independent of _funk_hecke)."""
    if attention == "softmax":
        gain = iv(ell + d / 2 - 1, beta) / (beta * iv(d / 2 - 1, beta))
    else:
        kappa = (2 * np.pi) ** (d / 2) * beta ** (1 - d / 2) * iv(ell + d / 2 - 1, beta)
        area = 2 * np.pi ** (d / 2) / gamma(d / 2)  # |S^{d-1}|
        gain = kappa / (beta * area)
    return ell * (ell + d - 2) * (gain - sigma**2 / 2)


@pytest.mark.parametrize("d", [3, 4])
@pytest.mark.parametrize("attention", ["softmax", "unnormalized"])
@pytest.mark.parametrize("sigma", [0.0, 0.3])
def test_growth_rates_match_linear_theory(d, attention, sigma):
    N, beta, eps, ell = 128, 4.0, 1e-6, 2
    V = zonal_volumes(N, d)
    P = cell_averages(lambda t: legendre(ell + 1, np.cos(t), d)[ell], N, d)
    rho0 = (1 + eps * P) / sphere_area(d)
    lam = linear_rate(ell, d, beta, sigma, attention)
    t1 = 0.5 / abs(lam)
    # Tolerances below the perturbation eps (atol 1e-8 would be 1 % of it).
    sol = simulate_zonal(
        rho0,
        t1,
        beta=beta,
        d=d,
        attention=attention,
        sigma=sigma,
        rtol=1e-10,
        atol=1e-13,
    )
    a = sol.rho @ (V * P)  # projection on P_l; P_0 and P_l are orthogonal
    got = np.log(a[1] / a[0]) / t1
    # Errors: O(h^2) = (pi / 128)^2 ~ 6e-4 (measured 3-5e-4), nonlinear O(eps);
    # tighter than the 1 % asked for, which a wrong factor would still break.
    assert abs(got / lam - 1) < 2e-3


def _cells(N):
    return (np.arange(N) + 0.5) * np.pi / N


@pytest.mark.parametrize("d", [2, 3, 5])
def test_heat_step_matches_expm(d):
    N, sigma = 24, 0.7
    h = np.pi / N
    g = _grid(N, d, 1.0)
    op = heat_operator(g.volumes, g.areas, h, sigma)
    D = np.diag(op.diag) + np.diag(op.lower[1:], -1) + np.diag(op.upper[:-1], 1)
    v = np.random.default_rng(0).random(N)
    for r in 10.0 ** np.arange(-3, 7):
        tau = r * h**2 / sigma**2
        got = np.asarray(heat(v[:, None], op, tau))[:, 0]
        want = scipy.linalg.expm(tau * D) @ v
        # Talbot's 24 nodes: 1e-14; both it and expm are perturbed by rounding
        # of tau D's entries, eps ||tau D|| (the problem's conditioning).
        tol = 1e-13 + 10 * EPS * np.abs(tau * D).max()
        assert np.abs(got - want).max() <= tol * v.max(), r
        kept = np.asarray(clip_mass(got[:, None], v[:, None], g.volumes))[:, 0]
        assert kept.min() >= 0
        assert abs(kept @ g.volumes - v @ g.volumes) <= 1e-14


def test_sample_and_w1():
    N, d = 64, 3
    rho = smooth(N, d)
    x = sample_zonal(jr.key(1), rho, 4000, d, axis=[0, 0, 2.0])
    np.testing.assert_allclose(np.linalg.norm(x, axis=1), 1, atol=1e-14)
    th = zonal_angles(x, axis=[0, 0, 1])
    w1 = zonal_w1(rho, th, d)
    # Expected W1 of n iid samples: sqrt(2 / (pi n)) int sqrt(F (1 - F)).
    grid = np.linspace(0, np.pi, 20001)
    F = np.interp(
        grid,
        np.arange(N + 1) * np.pi / N,
        np.concatenate([[0], np.cumsum(rho * zonal_volumes(N, d))]),
    )
    scale = np.sqrt(2 / (np.pi * 4000)) * np.trapezoid(
        np.sqrt(np.clip(F * (1 - F), 0, None)), grid
    )
    assert 0.3 * scale < w1 < 3 * scale
    # Exactness of zonal_w1 against a fine Riemann sum of |F - F_n|.
    pts = np.array([0.1, 0.5, 0.55, 2.0, 3.1])
    fine = (np.arange(400_000) + 0.5) * (np.pi / 400_000)
    faces = np.arange(N + 1) * np.pi / N
    cap = cap_fraction(faces, d)
    j = np.minimum((fine / (np.pi / N)).astype(int), N - 1)
    m = rho * zonal_volumes(N, d)
    Fd = np.concatenate([[0], np.cumsum(m)])[j] + m[j] * (
        cap_fraction(fine, d) - cap[j]
    ) / (cap[j + 1] - cap[j])
    Fn = np.searchsorted(pts, fine, side="right") / pts.size
    ref = np.abs(Fd - Fn).mean() * np.pi
    # Midpoint rule on 4e5 points with 5 jumps: error <= 5 pi / 4e5 / 5.
    assert abs(zonal_w1(rho, pts, d) - ref) < 1e-5


@pytest.mark.parametrize("d", [2, 3, 4, 5])
def test_measure_has_the_density_mean(d):
    N = 64
    rho = smooth(N, d)
    sol = simulate_zonal(rho, 0.1, beta=4.0, d=d)
    axis = np.arange(1.0, d + 1)
    mu = sol.measure(-1, axis=axis)
    e = axis / np.linalg.norm(axis)
    # The density's mean of x is <cos theta> e: exact by quadrature.
    want = cell_averages(np.cos, N, d) @ (sol.rho[-1] * sol.volumes)
    mean = np.asarray(mu.weights) @ np.asarray(mu.x)
    np.testing.assert_allclose(mean, want * e, atol=1e-14)
    np.testing.assert_allclose(np.linalg.norm(np.asarray(mu.x), axis=1), 1, atol=1e-14)


def _particle_w1(ns, seeds):
    d, beta, N, t1 = 3, 4.0, 256, 1.0
    th = _cells(N)
    rho0 = normalised(np.exp(np.cos(th) + 0.5 * np.cos(2 * th)), d)
    sol = simulate_zonal(rho0, t1, beta=beta, d=d)
    fine = simulate_zonal(normalised(np.repeat(rho0, 2), d), t1, beta=beta, d=d)
    # The density's own error: W1 between N and 2N (as a token-free bound).
    q = sample_zonal(jr.key(99), fine.rho[-1], 20000, d)
    disc = abs(
        zonal_w1(sol.rho[-1], zonal_angles(q), d)
        - zonal_w1(fine.rho[-1], zonal_angles(q), d)
    )
    attn = mf.SoftmaxAttention(np.eye(d), A=beta * np.eye(d))
    out = []
    for n in ns:
        w = []
        for s in range(seeds):
            x = sample_zonal(jr.key(s), rho0, n, d)
            ps = mf.simulate(
                mf.Particles(x), attn, t1, normalization="sphere", rtol=1e-8, atol=1e-8
            )
            w.append(zonal_w1(sol.rho[-1], zonal_angles(np.asarray(ps.x[-1])), d))
        out.append(np.mean(w))
    return np.array(out), disc


def _check_particles(ns, w, disc):
    # W1 sqrt(n) measured 1.0-1.4 (4 seeds, t = 1); iid samples give ~0.9.
    assert np.all((0.4 < w * np.sqrt(ns)) & (w * np.sqrt(ns) < 3))
    assert disc < 0.2 * w.min()  # the density's error is not what is measured
    slope = np.polyfit(np.log(ns), np.log(w), 1)[0]
    assert -0.75 < slope < -0.3


@pytest.mark.slow  # 6 s: three n of tokens; the slow version takes 8 seeds
def test_particles_approach_the_density():
    ns = np.array([256, 1024])
    w, disc = _particle_w1(ns, 4)
    _check_particles(ns, w, disc)


@pytest.mark.slow
def test_particles_approach_the_density_slow():
    ns = np.array([256, 1024, 4096])
    w, disc = _particle_w1(ns, 8)
    _check_particles(ns, w, disc)


def _ok(N=16, d=3):
    return normalised(np.ones(N), d)


@pytest.mark.parametrize(
    "kwargs, name",
    [
        (dict(rho0=-_ok()), "rho0"),
        (dict(rho0=np.full(16, np.nan)), "rho0"),
        (dict(rho0=2 * _ok()), "rho0"),
        (dict(rho0=normalised(np.ones(3), 3)), "rho0"),
        (dict(rho0=_ok(16), beta=100.0), "rho0"),  # 16 < 2 pi sqrt(100)
        (dict(d=1), "d"),
        (dict(d=3.0), "d"),
        (dict(d=True), "d"),
        (dict(beta=0.0), "beta"),
        (dict(beta=np.inf), "beta"),
        (dict(t1=-1.0), "t1"),
        (dict(t1=np.inf), "t1"),
        (dict(sigma=-0.1), "sigma"),
        (dict(attention="hardmax"), "attention"),
        (dict(saveat=[0.0, 2.0]), "saveat"),
        (dict(saveat=[-0.5, 0.5]), "saveat"),
    ],
)
def test_bad_input(kwargs, name):
    args = dict(rho0=_ok(), t1=1.0, beta=2.0, d=3) | kwargs
    with pytest.raises(ValueError, match=f"`{name}`"):
        simulate_zonal(args.pop("rho0"), args.pop("t1"), **args)
