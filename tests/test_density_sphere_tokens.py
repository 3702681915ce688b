"""Tokens from a density on S^2 (meanfield/density/_sphere_tokens.py)."""

import jax
import jax.numpy as jnp
import jax.random as jr
import numpy as np
import pytest

import meanfield as mf
from meanfield.density import _harmonics as sh
from meanfield.density._sphere_tokens import sample_sphere, sphere_values

# L = 24: at L = 16 the density sharpens past the band by T1 (status unresolved).
BETA, L, T1 = 4.0, 24, 0.5


def smooth_density(L: int) -> np.ndarray:
    """A smooth asymmetric density (a cap and a weaker one), band-limited, mass 1."""
    grid = sh.sphere_grid(L)
    x = np.asarray(grid.nodes)
    raw = np.exp(2 * x[:, 0]) + 0.5 * np.exp(3 * (0.6 * x[:, 1] + 0.8 * x[:, 2]))
    rho = np.asarray(sh.synthesis(grid, sh.analysis(grid, raw.reshape(grid.shape))))
    return rho / np.sum(grid.weights * rho.reshape(-1))


def moment_stats(x: np.ndarray) -> np.ndarray:
    """The 9 statistics x_a and x_a x_b (a <= b) of points (n, 3), shape (n, 9)."""
    iu = np.triu_indices(3)
    return np.concatenate([x, (x[:, :, None] * x[:, None, :])[:, iu[0], iu[1]]], 1)


def density_moments(rho: np.ndarray, L: int) -> tuple[np.ndarray, np.ndarray]:
    """(mean, standard deviation) of the 9 statistics under rho, by quadrature.

    Exact: the statistics have degree <= 2 and their squares degree <= 4, so the
    integrands have degree < L + 4 <= 3L - 3.
    """
    grid = sh.sphere_grid(L)
    w = grid.weights * rho.reshape(-1)
    s = moment_stats(np.asarray(grid.nodes))
    mean = w @ s
    return mean, np.sqrt(w @ (s - mean) ** 2)


@pytest.mark.parametrize("L", [2, 9, 40])
def test_point_values_match_synthesis(L):
    rng = np.random.default_rng(L)
    a = np.tril(rng.normal(size=(L, L)) + 1j * rng.normal(size=(L, L)))
    a[:, 0] = a[:, 0].real
    grid = sh.sphere_grid(L)
    want = np.asarray(sh.synthesis(grid, jnp.asarray(a))).reshape(-1)
    got = sphere_values(jnp.asarray(a), jnp.asarray(grid.nodes))
    # Two O(L^2)-term recurrences of O(1) values: rounding ~ L eps |f|.
    np.testing.assert_allclose(got, want, atol=1e-12 * np.abs(want).max())
    # And off the grid: the north pole, where only m = 0 survives.
    pole = sphere_values(jnp.asarray(a), jnp.array([[0.0, 0.0, 1.0]]))
    ell = np.arange(L)
    want_pole = np.sum(a[:, 0].real * np.sqrt((2 * ell + 1) / (4 * np.pi)))
    np.testing.assert_allclose(pole, [want_pole], rtol=1e-12)


def test_point_values_jit_vmap():
    a = jnp.zeros((4, 4), jnp.complex128).at[0, 0].set(1 / np.sqrt(4 * np.pi))
    x = jnp.eye(3)
    out = jax.vmap(sphere_values, in_axes=(None, 0))(a, jnp.stack([x, -x]))
    np.testing.assert_allclose(out, np.full((2, 3), 1 / (4 * np.pi)), rtol=1e-14)


def test_sample_moments_match_density(key):
    rho = smooth_density(L)
    n = 40_000
    x = sample_sphere(key, rho, n)
    assert x.shape == (n, 3) and x.dtype == np.float64
    np.testing.assert_allclose(np.linalg.norm(x, axis=1), 1, atol=1e-14)
    mean, sd = density_moments(rho, L)
    z = (moment_stats(x).mean(0) - mean) / (sd / np.sqrt(n))
    # 9 z-scores, each N(0, 1) for an exact sampler: all within 4 holds with
    # probability >= 1 - 9 * 6.3e-5 = 99.94 % (Bonferroni).
    assert np.all(np.abs(z) < 4), z


def test_sample_is_exact_past_a_bound_that_fails(key):
    # safety barely above 1: the grid maximum under-bounds the interpolant's
    # (it lies between nodes), the loop must raise the bound and start again.
    rho = smooth_density(L)
    grid = sh.sphere_grid(L)
    g = np.array(jr.normal(jr.fold_in(key, 1), (2**14, 3)))
    g /= np.linalg.norm(g, axis=1, keepdims=True)
    f = sphere_values(sh.analysis(grid, jnp.asarray(rho)), jnp.asarray(g))
    assert float(f.max()) > rho.max()  # the first bound does fail
    x = sample_sphere(key, rho, 20_000, safety=1.0 + 1e-9)
    mean, sd = density_moments(rho, L)
    z = (moment_stats(x).mean(0) - mean) / (sd / np.sqrt(x.shape[0]))
    assert np.all(np.abs(z) < 4), z  # as above


@pytest.mark.slow  # 8 s: three n, three seeds, each a particle solve
def test_tokens_follow_the_density(key):
    """Tokens sampled at t = 0 and run by `mf.simulate` against `simulate_sphere`.

    The moments of the tokens at T1 differ from the density's by a Monte Carlo
    error ~ n^{-1/2} (the ODE and the spectral solve are at 1e-8): the error
    falls with slope -1/2 in n, and stays within 5 standard deviations of the
    density's statistics at T1 (propagation of chaos changes the constant, not
    the rate; measured z-scores stay below 3).
    """
    rho0 = smooth_density(L)
    sol = mf.density.simulate_sphere(rho0, T1, beta=BETA)
    assert sol.status == "success"
    mean, sd = density_moments(sol.rho[-1], L)
    attn = mf.SoftmaxAttention(np.eye(3), A=BETA * np.eye(3))
    ns, seeds = (128, 512, 2048), 3
    errors = np.zeros((len(ns), seeds))
    for i, n in enumerate(ns):
        for s in range(seeds):
            x0 = sample_sphere(jr.fold_in(key, 100 * i + s), rho0, n)
            out = mf.simulate(
                mf.Particles(x0),
                attn,
                T1,
                normalization="sphere",
                rtol=1e-8,
                atol=1e-8,
            )
            assert out.status == "success"
            z = (moment_stats(np.asarray(out.x[-1])).mean(0) - mean) / sd
            assert np.all(np.abs(z) * np.sqrt(n) < 5), (n, z * np.sqrt(n))
            errors[i, s] = np.sqrt(np.mean(z**2))
    slope = np.polyfit(np.log(ns), np.log(errors.mean(1)), 1)[0]
    # -1/2 for a Monte Carlo error; 3 seeds x 9 statistics leave ~0.15 of noise.
    assert -0.8 < slope < -0.25, (slope, errors)


@pytest.mark.parametrize(
    "rho, n, kwargs, name",
    [
        (np.ones((5, 7)), 10, {}, "rho"),
        (np.ones(24), 10, {}, "rho"),
        (-np.ones((24, 48)), 10, {}, "rho"),
        (np.full((24, 48), np.nan), 10, {}, "rho"),
        (np.ones((24, 48)), 0, {}, "n"),
        (np.ones((24, 48)), 2.5, {}, "n"),
        (np.ones((24, 48)), 10, {"safety": 1.0}, "safety"),
    ],
)
def test_bad_input(key, rho, n, kwargs, name):
    with pytest.raises(ValueError, match=f"`{name}`") as info:
        sample_sphere(key, rho, n, **kwargs)
    assert "\n" not in str(info.value)


def test_negative_density_is_refused(key):
    rho = smooth_density(L)
    rho[3, 5] = -1e-3 * rho.max()
    with pytest.raises(ValueError, match="`rho` must be a nonnegative density"):
        sample_sphere(key, rho, 10)
