"""`clustering.phase_diagram` with noise: the Brownian paths of documented keys."""

import jax.numpy as jnp
import jax.random as jr
import numpy as np
import pytest

import meanfield as mf
from meanfield.clustering import pair_alignment

BETAS, SYSTEMS, N, D = np.array([1.0, 6.0]), 3, 5, 2
TS = np.linspace(0, 4, 3)
# Fixed steps: each system is a few dozen Heun steps.
OPTIONS = dict(n=N, d=D, systems=SYSTEMS, t1=4.0, saveat=TS, dt0=0.1, chunk_size=4)


# Second tier: the noisy ensemble's compilation alone takes 3 s (about 7 s).
@pytest.mark.slow
def test_noisy_diagram_is_reproducible_and_each_cell_a_solo_noisy_solve():
    """Chunks of 4 (the last padded) against `mf.simulate` on the documented keys."""
    noise = mf.IndependentNoise(0.3)
    pd = mf.clustering.phase_diagram(BETAS, key=jr.key(3), noise=noise, **OPTIONS)
    again = mf.clustering.phase_diagram(BETAS, key=jr.key(3), noise=noise, **OPTIONS)
    np.testing.assert_array_equal(pd.density, again.density)
    np.testing.assert_array_equal(pd.completed, [1.0, 1.0])
    # The tokens are those of the noise-free diagram; the paths are split off
    # fold_in(key, 1), one per system in the order (beta, system).
    x = jr.normal(jr.key(3), (BETAS.size * SYSTEMS, N, D))
    x = x / jnp.linalg.norm(x, axis=-1, keepdims=True)
    paths = jr.split(jr.fold_in(jr.key(3), 1), BETAS.size * SYSTEMS)
    for k, beta in enumerate(BETAS):
        aligned = []
        for s in range(SYSTEMS):
            one = mf.simulate(
                mf.Particles(x[k * SYSTEMS + s]),
                mf.SoftmaxAttention(jnp.eye(D), A=beta * jnp.eye(D)),
                4.0,
                saveat=TS,
                normalization="sphere",
                noise=noise,
                key=paths[k * SYSTEMS + s],
                dt0=0.1,
            )
            aligned.append(np.asarray(pair_alignment(one.x)))
        aligned = np.array(aligned)
        np.testing.assert_allclose(pd.density[k], aligned.mean(0), atol=1e-12)
        np.testing.assert_allclose(pd.one_cluster[k], (aligned == 1).mean(0))
    # The same tokens without noise: more pairs aligned to within eps at t1
    # (0.17 and 0.27 against 0 and 0.07 with noise).
    free = mf.clustering.phase_diagram(BETAS, key=jr.key(3), **OPTIONS)
    assert np.all(free.density[:, -1] > pd.density[:, -1] + 0.1)


def test_noise_arguments_are_checked():
    with pytest.raises(ValueError, match="`noise_key` draws the Brownian paths"):
        mf.clustering.phase_diagram([1.0], noise_key=jr.key(1))
    with pytest.raises(ValueError, match="normalization None"):
        mf.clustering.phase_diagram(
            [1.0], noise=mf.CommonNoise(0.1), normalization="pre-ln"
        )
