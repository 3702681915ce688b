"""Ensemble statistics of token directions (`mf.clustering.order_parameter`,
`aligned_groups`, `statistics`) against NumPy/SciPy references."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from scipy.sparse.csgraph import connected_components

import meanfield as mf
from meanfield.clustering import aligned_groups, order_parameter, statistics


def _directions(rng, shape):
    x = rng.standard_normal(shape)
    return x / np.linalg.norm(x, axis=-1, keepdims=True)


def test_order_parameter_is_the_weighted_mean_direction():
    rng = np.random.default_rng(0)
    x = 3.0 * rng.standard_normal((4, 7, 3))  # directions are taken
    w = rng.random((4, 7))
    w /= w.sum(1, keepdims=True)
    want = [
        np.linalg.norm(
            sum(w[b, i] * x[b, i] / np.linalg.norm(x[b, i]) for i in range(7))
        )
        for b in range(4)
    ]
    np.testing.assert_allclose(order_parameter(x, w), want, rtol=1e-14)
    # One cluster: 1; antipodal halves: 0.
    np.testing.assert_allclose(order_parameter(np.ones((5, 2))), 1.0, rtol=1e-15)
    halves = np.array([[1.0, 0.0]] * 3 + [[-1.0, 0.0]] * 3)
    assert abs(float(order_parameter(halves))) < 1e-15


@pytest.mark.parametrize(
    "weights",
    [
        [1.5, -0.5, 0.0, 0.0, 0.0],  # sums to 1, one negative
        [0.6] * 5,  # sums to 3: three times the order parameter
        [0.2, 0.2, np.nan, 0.2, 0.2],
        [[0.2] * 5, [0.4] * 5],  # one row of a batch off the simplex
    ],
)
def test_order_parameter_checks_its_weights_as_particles_do(weights):
    x = np.random.default_rng(4).standard_normal((2, 5, 3))
    w = np.asarray(weights)
    with pytest.raises(ValueError, match="`weights`"):
        order_parameter(x if w.ndim == 2 else x[0], w)
    with pytest.raises(ValueError, match="`weights`"):
        mf.Particles(x[0], w[-1] if w.ndim == 2 else w)
    # Under jit the same check is a runtime error, never a wrong number.
    checked = jax.jit(order_parameter)
    with pytest.raises(Exception, match="nonnegative and sum to 1"):
        checked(x[0], jnp.asarray([0.6] * 5)).block_until_ready()
    np.testing.assert_allclose(
        checked(x[0], jnp.full(5, 0.2)), order_parameter(x[0]), rtol=1e-15
    )


def test_order_parameter_of_uniform_directions_is_of_order_one_over_sqrt_n():
    # E R^2 = sum_i w_i^2 = 1/n exactly for independent uniform directions; the
    # mean of 4000 draws of n R^2 (variance <= 1 on S^2... bounded by 2) is 1
    # within 5 standard errors, 5 sqrt(2 / 4000) = 0.11.
    rng = np.random.default_rng(1)
    n = 50
    r = np.asarray(order_parameter(_directions(rng, (4000, n, 3))))
    assert abs(np.mean(n * r**2) - 1) < 0.11


def test_aligned_groups_are_the_components_of_the_alignment_graph():
    rng = np.random.default_rng(2)
    eps = 1e-2
    for trial in range(20):
        centres = _directions(rng, (rng.integers(1, 6), 3))
        labels = rng.integers(0, len(centres), 24)
        x = centres[labels] + 0.05 * rng.standard_normal((24, 3)) * (trial % 3)
        theta = x / np.linalg.norm(x, axis=1, keepdims=True)
        graph = theta @ theta.T > 1 - eps
        want, _ = connected_components(graph, directed=False)
        assert int(aligned_groups(x, eps)) == want
    # A chain: each token aligned with its neighbour only, one group.
    angles = np.arange(10) * 0.9 * np.arccos(1 - eps)
    chain = np.stack([np.cos(angles), np.sin(angles)], 1)
    assert int(aligned_groups(chain, eps)) == 1


def test_statistics_mark_non_finite_systems_and_check_their_input():
    x = np.ones((2, 4, 2))
    x[1, 0, 0] = np.inf
    assert np.isnan(order_parameter(x)[1]) and abs(order_parameter(x)[0] - 1) < 1e-15
    assert np.isnan(aligned_groups(x)[1]) and aligned_groups(x)[0] == 1
    with pytest.raises(ValueError, match="`eps`"):
        aligned_groups(x, 0.0)
    with pytest.raises(ValueError, match="`weights`"):
        order_parameter(np.ones((4, 2)), np.ones(3) / 3)
    with pytest.raises(TypeError, match="`sol`"):
        statistics(np.ones((4, 2)))


def test_statistics_reduce_an_ensemble_to_what_each_solve_gives():
    rng = np.random.default_rng(3)
    xs = _directions(rng, (3, 6, 2))
    attn = mf.SoftmaxAttention(np.eye(2), A=2.0 * np.eye(2))
    ts = np.linspace(0.0, 4.0, 5)
    options = dict(saveat=ts, normalization="sphere")
    got = mf.simulate_ensemble(
        jax.vmap(mf.Particles)(jnp.asarray(xs)),
        attn,
        4.0,
        reduce=statistics,
        **options,
    )
    assert got.order_parameter.shape == (3, 5) and got.groups.shape == (3, 5)
    for b in range(3):
        solo = statistics(mf.simulate(mf.Particles(xs[b]), attn, 4.0, **options))
        np.testing.assert_allclose(
            got.order_parameter[b], solo.order_parameter, rtol=1e-10
        )
        np.testing.assert_array_equal(got.groups[b], solo.groups)
        np.testing.assert_allclose(got.pair_alignment[b], solo.pair_alignment)
    # The tokens gather: the order parameter grows towards 1.
    assert np.all(got.order_parameter[:, -1] > got.order_parameter[:, 0])
