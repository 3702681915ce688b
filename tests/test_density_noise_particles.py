"""`density.simulate_particles` with noise: tokens with Brownian motions on S^1."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import meanfield as mf
from meanfield import density


def _smooth(N):
    """A smooth initial density with two unequal bumps, mass 1 on N cells."""
    theta = density.cell_centres(N)
    rho = np.exp(2 * np.cos(theta) + 0.5 * np.cos(3 * theta - 1))
    return rho / (rho.sum() * 2 * np.pi / N)


THETA = density.sample_quantiles(_smooth(64), 8)
TS = np.linspace(0, 0.5, 3)


def _run(sigma, key):
    return density.simulate_particles(
        THETA, 0.5, beta=4.0, sigma=sigma, key=key, saveat=TS
    )


def test_one_key_is_one_path():
    a, b = _run(0.5, jax.random.key(0)), _run(0.5, jax.random.key(0))
    assert a.status == "success"
    np.testing.assert_array_equal(a.x, b.x)
    other = _run(0.5, jax.random.key(1))
    assert np.abs(np.asarray(other.x[-1] - a.x[-1])).max() > 1e-2
    # On the circle throughout (the noise is projected on S^1).
    np.testing.assert_allclose(np.linalg.norm(a.x, axis=-1), 1, atol=1e-12)


def test_sigma_zero_is_the_ode_at_tolerance_1e_8():
    x0 = np.stack([np.cos(THETA), np.sin(THETA)], 1)
    want = mf.simulate(
        mf.Particles(x0),
        mf.SoftmaxAttention(jnp.eye(2), A=4.0 * jnp.eye(2)),
        0.5,
        saveat=TS,
        normalization="sphere",
        rtol=1e-8,
        atol=1e-8,
    )
    np.testing.assert_array_equal(_run(0.0, None).x, want.x)
    np.testing.assert_array_equal(_run(0.0, jax.random.key(0)).x, want.x)  # unused


# Second tier: two particle solves and a density solve (about 6 s).
@pytest.mark.slow
def test_noisy_particles_sample_the_noisy_density():
    """W1 to `density.simulate(sigma=...)` within the error of n samples.

    For n i.i.d. samples of a law with CDF F on the line, E W1 <= C / sqrt(n),
    C = int sqrt(F (1 - F)) (Bobkov & Ledoux, 2019, Thm 3.5); the circle's W1 is
    at most the line's. Independent noise makes the tokens nearly i.i.d.
    (propagation of chaos); measured W1 is 0.3 to 0.5 of the bound over seeds.
    The noise-free tokens are 2.3 bounds away: the noise is seen.
    """
    N, n, beta, sigma, t1 = 256, 256, 8.0, 0.6, 2.0
    rho0, ts = _smooth(N), np.linspace(0, t1, 3)
    noisy = density.simulate(rho0, t1, beta=beta, sigma=sigma, saveat=ts)
    theta = density.sample_quantiles(rho0, n)
    particles = density.simulate_particles(
        theta, t1, beta=beta, sigma=sigma, key=jax.random.key(0), saveat=ts
    )
    assert particles.status == "success"
    angles = density.angles(particles.x)
    for i in (1, 2):
        cdf = np.cumsum(noisy.rho[i]) * 2 * np.pi / N
        bound = np.sum(np.sqrt(np.clip(cdf * (1 - cdf), 0, None))) * 2 * np.pi / N
        bound /= np.sqrt(n)
        assert density.circle_w1(noisy.rho[i], angles[i]) < bound, i
    free = density.simulate_particles(theta, t1, beta=beta, saveat=ts)
    assert density.circle_w1(noisy.rho[-1], density.angles(free.x[-1])) > 2 * bound


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        (dict(sigma=-0.1, key=jax.random.key(0)), "`sigma` must be >= 0"),
        (dict(sigma=float("nan"), key=jax.random.key(0)), "`sigma` must be >= 0"),
        (dict(sigma=0.5), "`key` is required with `sigma` > 0"),
        (dict(sigma=0.5, key=3), "`key` must be a JAX PRNG key"),
    ],
)
def test_bad_noise_arguments_are_refused(kwargs, message):
    with pytest.raises(ValueError, match=message):
        density.simulate_particles(np.zeros(4), 1.0, beta=1.0, **kwargs)
