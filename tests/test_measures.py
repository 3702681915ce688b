import jax
import jax.numpy as jnp
import jax.random as jr
import numpy as np
import pytest

import meanfield as mf


def test_particles_defaults_to_uniform_weights():
    mu = mf.Particles(np.ones((4, 2)))
    np.testing.assert_array_equal(mu.weights, np.full(4, 0.25))
    assert mu.n == 4 and mu.dim == 2


def test_integer_input_becomes_float():
    assert jnp.issubdtype(
        mf.Particles(np.ones((3, 2), dtype=int)).x.dtype, jnp.floating
    )


def test_measure_keeps_its_dtype():
    mu = mf.Particles(np.ones((3, 2), np.float32))
    assert mu.x.dtype == jnp.float32 and mu.weights.dtype == jnp.float32


@pytest.mark.parametrize(
    "x, match",
    [
        (np.ones(3), r"`x` must have shape \(n, d\)"),
        (np.ones((2, 3, 1)), r"`x` must have shape \(n, d\)"),
        (np.ones((0, 2)), r"`x` must have shape \(n, d\)"),
        (np.array([[0.0, np.nan]]), r"`x` contains NaN or inf"),
        (np.array([[0.0, np.inf]]), r"`x` contains NaN or inf"),
    ],
)
def test_particles_rejects_bad_x(x, match):
    with pytest.raises(ValueError, match=match):
        mf.Particles(x)


@pytest.mark.parametrize(
    "w, match",
    [
        (np.array([0.5, 0.5, 0.0, 0.0]), r"`weights` must have shape"),
        (np.array([0.5, 0.6, -0.1]), r"`weights` must be nonnegative"),
        (np.array([0.5, 0.5, 0.5]), r"sum to 1"),
        (np.array([0.5, np.nan, 0.5]), r"`weights` contains NaN"),
    ],
)
def test_particles_rejects_bad_weights(w, match):
    with pytest.raises(ValueError, match=match):
        mf.Particles(np.zeros((3, 2)), w)


def test_weight_check_survives_jit():
    make = jax.jit(lambda x, w: mf.Particles(x, w).x)
    make(jnp.zeros((2, 2)), jnp.array([0.5, 0.5]))
    with pytest.raises(Exception, match="nonnegative and sum to 1"):
        make(jnp.zeros((2, 2)), jnp.array([0.5, 0.7])).block_until_ready()


@pytest.mark.parametrize(
    "s, match",
    [
        (np.array([0.0, 0.5, 1.5]), r"`positions` must lie in \[0, 1\]"),
        (np.array([-0.1, 0.5, 1.0]), r"`positions` must lie in \[0, 1\]"),
        (np.array([0.0, 1.0]), r"`positions` must have shape"),
        (np.array([0.0, np.nan, 1.0]), r"`positions` contains NaN"),
    ],
)
def test_masked_particles_rejects_bad_positions(s, match):
    with pytest.raises(ValueError, match=match):
        mf.MaskedParticles(np.zeros((3, 2)), s)


@pytest.mark.parametrize(
    "mean, cov, match",
    [
        (np.zeros((2, 1)), np.eye(2), r"`mean` must have shape \(d,\)"),
        (np.zeros(2), np.eye(3), r"`cov` must have shape \(d, d\)"),
        (np.zeros(2), np.array([[1.0, 0.5], [0.0, 1.0]]), r"`cov` must be symmetric"),
        (np.zeros(2), np.array([[1.0, 2.0], [2.0, 1.0]]), r"positive definite"),
        (np.zeros(2), np.zeros((2, 2)), r"positive definite"),
        (np.array([0.0, np.inf]), np.eye(2), r"`mean` contains NaN or inf"),
    ],
)
def test_gaussian_rejects_bad_input(mean, cov, match):
    with pytest.raises(ValueError, match=match):
        mf.Gaussian(mean, cov)


@pytest.mark.parametrize("n", [-3, 0, 2.5, True, None])
def test_gaussian_sample_rejects_a_bad_count(key, n):
    # Before: XLA's MLIRError (invalid tensor dimension), a TypeError, or 1 sample.
    gauss = mf.Gaussian(np.zeros(2), np.eye(2))
    with pytest.raises(ValueError, match=r"^`n` must be a positive integer; got "):
        gauss.sample(key, n)


def test_gaussian_sample_moments(key):
    mean = np.array([1.0, -2.0])
    cov = np.array([[2.0, 0.6], [0.6, 0.5]])
    n = 200_000
    mu = mf.Gaussian(mean, cov).sample(key, n)
    assert isinstance(mu, mf.Particles) and mu.x.shape == (n, 2)
    # Monte Carlo: standard errors are sqrt(var / n) ~ 3e-3; allow 5 sigma.
    np.testing.assert_allclose(mu.x.mean(0), mean, atol=5 * np.sqrt(2.0 / n))
    np.testing.assert_allclose(np.cov(np.asarray(mu.x).T), cov, atol=0.02)


def test_measures_are_pytrees_under_vmap(key):
    xs = jr.normal(key, (5, 4, 2))
    means = jax.vmap(lambda x: mf.Particles(x).x.mean(0))(xs)
    np.testing.assert_allclose(means, xs.mean(1))
