"""The mean-field density on S^2: spherical-harmonic transforms and the solver.

The uniform density on S^2 under attention with A = beta I, V = I grows its
degree-l harmonics at lambda_l = l (l + 1) [kappa_l / (beta kappa_0) - sigma^2 / 2]
(softmax) or l (l + 1) [kappa_l / (4 pi beta) - sigma^2 / 2] (unnormalised),
kappa_l = (2 pi)^{3/2} beta^{-1/2} I_{l+1/2}(beta) the Funk-Hecke eigenvalues.
"""

import diffrax as dfx
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from scipy.special import iv, sph_harm_y

import meanfield as mf
from meanfield.density import _harmonics as sh
from meanfield.density._funk_hecke import scaled_funk_hecke
from meanfield.density._sphere import (
    GeneralField,
    _status,
    min_band_limit,
    simulate_sphere,
    top_energy_fraction,
)


def _random_coefficients(L, seed, decay=None):
    """Random band-limited coefficients (L, L) [l, m] of a real function."""
    rng = np.random.default_rng(seed)
    a = rng.normal(size=(L, L)) + 1j * rng.normal(size=(L, L))
    a = np.tril(a)
    a[:, 0] = a[:, 0].real
    if decay is not None:
        a = a * decay ** np.arange(L)[:, None]
    return a


def _smooth_density(grid, c=(0.7, 0.4, 0.3)):
    """exp(c0 z + c1 x y + c2 y), normalised: entire, not axisymmetric."""
    x = grid.nodes
    rho = np.exp(c[0] * x[:, 2] + c[1] * x[:, 0] * x[:, 1] + c[2] * x[:, 1])
    rho = rho / np.sum(grid.weights * rho)
    return rho.reshape(grid.shape)


def _perturbed_uniform(grid, eps, ells, seed=0):
    """1 / (4 pi) + eps sum of random harmonics of the degrees `ells`."""
    L = grid.L
    a = np.zeros((L, L), complex)
    a[0, 0] = 1 / np.sqrt(4 * np.pi)
    rng = np.random.default_rng(seed)
    for ell in ells:
        a[ell, : ell + 1] = eps * (
            rng.normal(size=ell + 1) + 1j * rng.normal(size=ell + 1)
        )
        a[ell, 0] = a[ell, 0].real
    return np.asarray(sh.synthesis(grid, a)), a


# --- transforms -------------------------------------------------------------


@pytest.mark.parametrize("L", [2, 9, 32])
def test_grid_quadrature_and_nodes(L):
    grid = sh.sphere_grid(L)
    assert grid.shape == ((3 * L + 1) // 2, 3 * L)
    # Rounding of a sum of M positive terms: ~M eps relative.
    np.testing.assert_allclose(grid.weights.sum(), 4 * np.pi, rtol=1e-13)
    np.testing.assert_allclose(np.linalg.norm(grid.nodes, axis=1), 1, rtol=1e-15)
    e_t, e_p = grid.tangent_frame()
    frame = np.stack([grid.nodes, e_t, e_p], 1)  # orthonormal at every node
    np.testing.assert_allclose(
        np.einsum("nia,nja->nij", frame, frame),
        np.broadcast_to(np.eye(3), frame.shape),
        atol=1e-15,
    )


@pytest.mark.parametrize("L", [8, 48])
def test_round_trip_of_band_limited_data_is_exact(L):
    grid = sh.sphere_grid(L)
    a = _random_coefficients(L, seed=L)
    f = jax.jit(sh.synthesis)(grid, a)
    back = jax.jit(sh.analysis)(grid, f)
    # O(1) coefficients, O(L nlat) flops per entry: ~1e-14 (measured 5e-14 at L = 64).
    np.testing.assert_allclose(back, a, atol=1e-13)


def test_synthesis_matches_scipy_harmonics():
    """Y_lm = (-1)^m SciPy's (which carries the Condon-Shortley phase)."""
    L = 10
    grid = sh.sphere_grid(L)
    theta, phi = np.asarray(grid.theta), grid.phi
    for ell, m in [(0, 0), (1, 0), (1, 1), (5, 3), (9, 9), (9, 4)]:
        a = np.zeros((L, L), complex)
        a[ell, m] = 1.0 if m == 0 else 0.5  # 0.5 (Y_lm + conj): Re Y_lm
        want = (-1) ** m * sph_harm_y(ell, m, theta[:, None], phi[None, :]).real
        np.testing.assert_allclose(sh.synthesis(grid, a), want, atol=1e-14)


def test_gradient_of_coordinates():
    """grad z = -sin(t) e_theta; grad x = cos(t) cos(p) e_theta - sin(p) e_phi."""
    L = 6
    grid = sh.sphere_grid(L)
    x = grid.nodes.reshape(grid.shape + (3,))
    a = sh.analysis(grid, np.stack([x[..., 0], x[..., 2]]))
    d_theta, d_phi = sh.gradient(grid, a)
    ct = np.asarray(grid.cos_theta)[:, None]
    st = np.asarray(grid.sin_theta)[:, None]
    cp, sp = np.cos(grid.phi)[None, :], np.sin(grid.phi)[None, :]
    np.testing.assert_allclose(d_theta[0], ct * cp, atol=1e-14)
    np.testing.assert_allclose(d_phi[0], -sp + 0 * ct, atol=1e-14)
    np.testing.assert_allclose(d_theta[1], -st + 0 * cp, atol=1e-14)
    np.testing.assert_allclose(d_phi[1], 0, atol=1e-14)


@pytest.mark.parametrize("L", [8, 40])
def test_divergence_of_gradient_is_the_laplacian(L):
    """div grad Y_lm = -l (l + 1) Y_lm, the weak divergence against the gradient."""
    grid = sh.sphere_grid(L)
    a = _random_coefficients(L, seed=1)
    d_theta, d_phi = jax.jit(sh.gradient)(grid, a)
    div = jax.jit(sh.weak_divergence)(grid, d_theta, d_phi)
    want = sh.laplacian_eigenvalues(L)[:, None] * a
    # Entries up to l (l + 1) ~ 1.6e3 at L = 40; the 1 / sin(theta) of the
    # derivative table near the poles costs a few digits: 1e-12 relative.
    np.testing.assert_allclose(div, want, atol=1e-12 * L**2)
    assert div[0, 0] == 0  # degree 0 exactly: the mass


def test_funk_hecke_convolution_matches_quadrature():
    """sum_lm kappa_l a_lm Y_lm = int e^{beta <x, y>} rho(y) dy at the nodes."""
    L, beta = 12, 3.0
    grid = sh.sphere_grid(L)
    a = _random_coefficients(L, seed=2, decay=0.5)
    kappa = scaled_funk_hecke(np.arange(L), beta, 3) * np.exp(beta)
    spectral = np.asarray(sh.synthesis(grid, kappa[:, None] * a)).reshape(-1)
    rho = np.asarray(sh.synthesis(grid, a)).reshape(-1)
    x = grid.nodes
    direct = np.exp(beta * x @ x.T) @ (grid.weights * rho)
    # The quadrature misses e^{beta t}'s degrees >= 2 nlat - L = 25: ~I_25(3),
    # far below rounding (1e-15 of the kernel's e^beta ~ 20).
    np.testing.assert_allclose(spectral, direct, atol=1e-13 * np.exp(beta))


# --- the solver ---------------------------------------------------------------


def _rates(ells, beta, attention, sigma):
    ells = np.asarray(ells, np.float64)
    if attention == "softmax":
        drift = iv(ells + 0.5, beta) / (beta * iv(0.5, beta))
    else:
        kappa = (2 * np.pi) ** 1.5 * beta**-0.5 * iv(ells + 0.5, beta)
        drift = kappa / (4 * np.pi * beta)
    return ells * (ells + 1) * (drift - sigma**2 / 2)


@pytest.mark.parametrize("sigma", [0.0, 0.6])
@pytest.mark.parametrize(
    ("attention", "beta"), [("softmax", 4.0), ("unnormalized", 2.0)]
)
def test_growth_rates_match_linear_theory(attention, beta, sigma):
    L, eps, t1 = 12, 1e-7, 0.2
    ells = np.arange(1, 5)
    grid = sh.sphere_grid(L)
    rho0, _ = _perturbed_uniform(grid, eps, ells)
    # atol far below eps: the steps resolve the perturbation, not only rho ~ 0.08.
    sol = simulate_sphere(
        rho0, t1, beta=beta, attention=attention, sigma=sigma, rtol=1e-10, atol=1e-16
    )
    assert sol.status == "success"
    a0, a1 = sol.coefficients(0), sol.coefficients(-1)
    for ell, want in zip(ells, _rates(ells, beta, attention, sigma), strict=True):
        got = np.log(np.abs(a1[ell, : ell + 1]) / np.abs(a0[ell, : ell + 1])) / t1
        # Nonlinear terms O(eps), steps at rtol 1e-10: measured <= 4e-5
        # relative (the smallest rates are 0.015 and -0.024 in size).
        np.testing.assert_allclose(got, want, rtol=1e-3)


def test_mass_is_conserved_to_rounding():
    L = 12
    grid = sh.sphere_grid(L)
    sol = simulate_sphere(
        _smooth_density(grid), 2.0, beta=4.0, sigma=0.6, saveat=np.linspace(0, 2, 5)
    )
    assert sol.status == "success"
    assert np.all(np.isfinite(sol.ts))
    # Degree 0 of the rate is exactly 0: only the final quadrature's rounding.
    np.testing.assert_allclose(sol.mass, 1, atol=1e-14)
    # a_00 never changes, not even by an ulp: the rate's degree 0 is exactly 0
    # and the heat factor there exactly 1.
    np.testing.assert_array_equal(sol.coeffs[:, 0, 0], sol.coeffs[0, 0, 0])
    np.testing.assert_allclose(sol.coeffs[0, 0, 0], 1 / np.sqrt(4 * np.pi), rtol=1e-15)
    # The density moved (the test is not vacuous).
    assert np.abs(sol.rho[-1] - sol.rho[0]).max() > 1e-2


def _rotation(seed):
    q, r = np.linalg.qr(np.random.default_rng(seed).normal(size=(3, 3)))
    return q * np.sign(np.diag(r))


@pytest.mark.parametrize(
    ("attention", "beta"),
    [("softmax", 3.0), pytest.param("unnormalized", 1.5, marks=pytest.mark.slow)],
)
def test_general_path_with_isotropic_kernel_equals_zonal(attention, beta):
    L = 12
    grid = sh.sphere_grid(L)
    rho0 = _smooth_density(grid)
    R = np.sqrt(beta) * _rotation(3)  # Q^T K = beta R^T R = beta I
    kw = dict(attention=attention, sigma=0.3, saveat=[0.0, 0.5, 1.0])
    zonal = simulate_sphere(rho0, 1.0, beta=beta, **kw)
    general = simulate_sphere(rho0, 1.0, Q=R, K=R, V=np.eye(3), **kw)
    # The same status (short of "failed"), whatever the band makes of it.
    assert zonal.status == general.status
    assert zonal.status in ("success", "unresolved")
    assert np.all(np.isfinite(zonal.ts))
    # Same scheme up to the quadrature of e^{beta t} beyond degree 2 nlat - L
    # (~I_24(3) / I_0(3) ~ 1e-25) and rounding: measured 2e-15.
    np.testing.assert_allclose(general.rho, zonal.rho, atol=1e-10)


@pytest.mark.parametrize(
    ("attention", "family"),
    [
        # Second tier (5 s each): the default tier keeps the general path
        # against the zonal one (`test_general_path_with_isotropic_kernel_...`).
        pytest.param("softmax", mf.SoftmaxAttention, marks=pytest.mark.slow),
        pytest.param("unnormalized", mf.UnnormalizedAttention, marks=pytest.mark.slow),
    ],
)
def test_general_path_matches_weighted_particles(attention, family):
    """The nodes as atoms of weights w rho0 under `mf.simulate`: the same flow.

    At t = 0 the particle field at the nodes is the solver's quadrature,
    term for term. Later the atoms move and the density is truncated at L;
    both are spectrally accurate, so their moments agree to the density's
    truncation error, estimated by the distance to a coarser band.
    """
    rng = np.random.default_rng(5)
    Q, K, V = rng.normal(size=(3, 3, 3))
    scale = np.sqrt(1.5 / np.linalg.norm(K.T @ Q, 2))
    Q, K = scale * Q, scale * K
    t1, ts = 0.4, [0.0, 0.2, 0.4]
    moments = {}
    for L in (8, 12):
        grid = sh.sphere_grid(L)
        sol = simulate_sphere(
            _smooth_density(grid),
            t1,
            Q=Q,
            K=K,
            V=V,
            attention=attention,
            saveat=ts,
            rtol=1e-11,
            atol=1e-13,
        )
        assert sol.status in ("success", "unresolved")
        w = grid.weights * sol.rho.reshape(len(ts), -1)
        x = grid.nodes
        moments[L] = (w @ x, np.einsum("tn,na,nb->tab", w, x, x))
    w0 = grid.weights * _smooth_density(grid).reshape(-1)
    attn = family(V, Q=Q, K=K)
    mu = mf.Particles(x, w0)
    field = np.array(attn.velocity(mu))
    field -= np.sum(field * x, 1, keepdims=True) * x
    ours = GeneralField(
        jnp.asarray(Q), jnp.asarray(K), jnp.asarray(V), attention == "softmax", 256
    ).field(grid, jnp.asarray(_smooth_density(grid)))
    ours = np.asarray(ours) - np.sum(np.asarray(ours) * x, 1, keepdims=True) * x
    np.testing.assert_allclose(ours, field, atol=1e-13)  # same sums, reordered
    part = mf.simulate(
        mu, attn, t1, saveat=ts, normalization="sphere", rtol=1e-11, atol=1e-13
    )
    px = np.asarray(part.x)
    got = (w0 @ px, np.einsum("n,tna,tnb->tab", w0, px, px))
    for k in range(2):
        coarse = np.abs(moments[8][k] - moments[12][k]).max()
        err = np.abs(moments[12][k] - got[k]).max()
        # Truncation falls geometrically in L (>= 10x per 4 degrees, measured
        # 100x): the L = 12 density is within a tenth of the L = 8 one's distance.
        assert err <= 0.1 * coarse + 1e-13, (k, err, coarse)


@pytest.mark.slow  # 7 s: four band limits
def test_error_falls_geometrically_with_the_band_limit():
    beta, sigma, t1 = 2.0, 0.3, 0.5
    Ls, ref_L = (6, 9, 12), 24
    sols = {}
    for L in (*Ls, ref_L):
        grid = sh.sphere_grid(L)
        sols[L] = simulate_sphere(
            _smooth_density(grid), t1, beta=beta, sigma=sigma, rtol=1e-12, atol=1e-14
        ).coefficients(-1)
    ref = sols[ref_L]
    errors = []
    for L in Ls:
        # L^2 error by Parseval: mismatch below L, the reference's tail above.
        diff = np.abs(sols[L] - ref[:L, :L]) ** 2
        tail = np.abs(ref[L:]) ** 2
        errors.append(
            np.sqrt(diff.sum() + diff[:, 1:].sum() + tail.sum() + tail[:, 1:].sum())
        )
    errors = np.array(errors)
    ratios = errors[1:] / errors[:-1]
    # Geometric: a constant factor per 3 degrees, far from algebraic rates
    # ((6/9)^p for order p). The density exp(0.7 z + ...) decays like ~1/l!.
    assert np.all(ratios < 0.05), errors
    assert errors[-1] < 1e-8, errors


def test_status_is_unresolved_when_clusters_collapse():
    """Without noise clusters sharpen without bound: the band runs out."""
    L, beta = 12, 9.0
    grid = sh.sphere_grid(L)
    rho0, _ = _perturbed_uniform(grid, 1e-2, [2, 3])
    sol = simulate_sphere(rho0, 30.0, beta=beta, saveat=np.linspace(0, 30, 7))
    assert sol.status == "unresolved"
    assert not np.all(np.isfinite(sol.ts))  # stopped once hopeless
    assert top_energy_fraction(sol.coeffs[0]) < 1e-10


def test_status_negative_and_success_from_the_saved_densities():
    grid = sh.sphere_grid(6)
    a = np.zeros((1, 6, 6), complex)
    a[0, 0, 0] = 1 / np.sqrt(4 * np.pi)
    rho = np.asarray(sh.synthesis(grid, a))
    ok = dfx.RESULTS.successful
    assert _status(ok, rho, a) == "success"
    bad = rho.copy()
    bad[0, 0, 0] = -1e-3 * rho.max()
    assert _status(ok, bad, a) == "negative"
    assert _status(ok, rho * np.nan, a) == "failed"
    assert _status(dfx.RESULTS.max_steps_reached, rho, a) == "max_steps"


def test_measure_is_the_density_as_weighted_nodes():
    grid = sh.sphere_grid(12)
    rho0 = _smooth_density(grid)
    sol = simulate_sphere(rho0, 0.1, beta=4.0)
    mu = sol.measure(-1)
    assert isinstance(mu, mf.Particles)
    np.testing.assert_allclose(np.sum(mu.weights), 1, rtol=1e-14)
    first = (grid.weights * sol.rho[-1].reshape(-1)) @ grid.nodes
    np.testing.assert_allclose(np.asarray(mu.weights) @ grid.nodes, first, atol=1e-14)
    assert "SphereSolution(status='success'" in repr(sol)


def test_min_band_limit_grows_like_sqrt_beta():
    Ls = np.array([min_band_limit(b) for b in (4.0, 16.0, 64.0)])
    # kappa_L / kappa_0 ~ e^{-L^2 / (2 beta)}: L ~ sqrt(2 beta ln 1e3) ~ 3.7 sqrt(beta).
    np.testing.assert_allclose(Ls / np.sqrt([4.0, 16.0, 64.0]), 3.7, rtol=0.25)


# --- bad input ------------------------------------------------------------------


def _good():
    grid = sh.sphere_grid(8)
    return grid, _smooth_density(grid)


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        (dict(beta=2.0, Q=np.eye(3), K=np.eye(3), V=np.eye(3)), "either `beta`"),
        (dict(), "either `beta`"),
        (dict(Q=np.eye(3), K=np.eye(3)), "all three"),
        (dict(Q=np.eye(2), K=np.eye(3), V=np.eye(3)), "`Q` must be a finite"),
        (dict(Q=np.eye(3), K=np.eye(3), V=np.ones((3, 4))), "`V` must be a finite"),
        (dict(beta=-1.0), "`beta` must be positive"),
        (dict(beta=2.0, sigma=-0.1), "`sigma` must be >= 0"),
        (dict(beta=2.0, attention="hardmax"), "`attention` must be one of"),
        (dict(beta=2.0, saveat=[0.0, 2.0]), "`saveat` must be"),
        (dict(beta=2.0, saveat=[0.5, 0.1]), "`saveat` must be"),
        (dict(beta=2.0, L=9), "does not match"),
        (dict(beta=40.0), "too small for beta"),
        (dict(beta=800.0, attention="unnormalized"), "too large"),
    ],
)
def test_bad_arguments_raise(kwargs, match):
    _, rho0 = _good()
    with pytest.raises(ValueError, match=match):
        simulate_sphere(rho0, 1.0, **kwargs)


def test_bad_densities_raise():
    grid, rho0 = _good()
    with pytest.raises(ValueError, match="`rho0` must have the shape"):
        simulate_sphere(rho0[:-1], 1.0, beta=2.0)
    with pytest.raises(ValueError, match="`rho0` must have the shape"):
        simulate_sphere(rho0.reshape(-1), 1.0, beta=2.0)
    with pytest.raises(ValueError, match="nonnegative"):
        simulate_sphere(np.where(rho0 == rho0.max(), -1.0, rho0), 1.0, beta=2.0)
    with pytest.raises(ValueError, match="mass"):
        simulate_sphere(2 * rho0, 1.0, beta=2.0)
    with pytest.raises(ValueError, match="`t1` must be positive"):
        simulate_sphere(rho0, 0.0, beta=2.0)
    with pytest.raises(ValueError, match="`L` must be an integer"):
        sh.sphere_grid(1)
