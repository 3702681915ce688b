"""The work-queue scheduling of `mf.simulate_ensemble` against lockstep vmap.

Each slot of the queue runs `simulate`'s own algorithm (field, Tsit5 step,
controller, clipping to t1, dense output), so every system must match its
lockstep solve to rounding; systems that stop early are solved again by
`simulate` and must match exactly. Float64 throughout.
"""

import jax
import jax.numpy as jnp
import jax.random as jr
import numpy as np
import pytest

import meanfield as mf
from meanfield._linalg import last_axis_sum, matmul_small, row_norms
from meanfield._small_field import SmallSoftmax


def _systems(count, n, d, seed=0, masked=False):
    x = np.asarray(jr.normal(jr.key(seed), (count, n, d)))
    if masked:
        s = np.broadcast_to(np.arange(n) / n, (count, n))
        return jax.vmap(mf.MaskedParticles)(jnp.asarray(x), jnp.asarray(s))
    return jax.vmap(mf.Particles)(jnp.asarray(x))


def _both(measures, attn, t1, **options):
    queue = mf.simulate_ensemble(measures, attn, t1, scheduling="queue", **options)
    vmap = mf.simulate_ensemble(measures, attn, t1, scheduling="vmap", **options)
    return queue, vmap


def _assert_same(queue, vmap, atol):
    np.testing.assert_array_equal(queue.result, vmap.result)
    np.testing.assert_array_equal(queue.ts, vmap.ts)
    np.testing.assert_allclose(queue.x, vmap.x, rtol=0, atol=atol)
    np.testing.assert_allclose(queue.t_final, vmap.t_final, rtol=1e-12)
    np.testing.assert_array_equal(queue.blowup_time, vmap.blowup_time)


# Slow tier: the default suite reaches the queue through `auto` in
# tests/test_ensemble.py and tests/test_phase_diagram.py.
@pytest.mark.slow
@pytest.mark.parametrize("normalization", [None, "sphere", "pre-ln", "peri-ln", "ngpt"])
def test_the_queue_is_the_lockstep_solve_under_every_normalization(normalization):
    """Batched temperatures, 31 saves: same steps, saves to 1e-12."""
    betas = jnp.linspace(0.5, 4.0, 12)
    attn = jax.vmap(lambda b: mf.SoftmaxAttention(jnp.eye(3), A=b * jnp.eye(3)))(betas)
    measures = _systems(12, 6, 3)
    queue, vmap = _both(
        measures,
        attn,
        2.0,
        saveat=np.linspace(0, 2, 31),
        normalization=normalization,
        rtol=1e-8,
        atol=1e-8,
    )
    np.testing.assert_array_equal(queue.num_steps, vmap.num_steps)
    _assert_same(queue, vmap, 1e-12)


@pytest.mark.slow
@pytest.mark.parametrize("family", ["l2", "sinkhorn", "unnormalized"])
def test_other_families_and_masks_go_through_the_queue_unchanged(family):
    """Any family, a shared attention, causal masks, saves at t0 and t1 only."""
    d = 2
    eye = jnp.eye(d)
    attn = {
        "l2": lambda: mf.L2Attention(eye, Q=eye, K=eye),
        "sinkhorn": lambda: mf.SinkhornAttention(eye, A=eye),
        "unnormalized": lambda: mf.UnnormalizedAttention(eye, A=0.5 * eye),
    }[family]()
    measures = _systems(8, 5, d, seed=1, masked=family != "sinkhorn")
    queue, vmap = _both(measures, attn, 1.0, normalization="sphere", rtol=1e-8)
    assert queue.ts.shape == (8, 2) and np.all(queue.ts[:, 1] == 1.0)
    np.testing.assert_array_equal(queue.num_steps, vmap.num_steps)
    _assert_same(queue, vmap, 1e-12)


@pytest.mark.slow
def test_systems_that_stop_early_are_those_of_simulate():
    """A blow-up and a step budget beside finishing systems: exact statuses."""
    eye = jnp.eye(2)
    # Unnormalised attention without a normalization blows up from large tokens.
    scales = jnp.asarray([0.1, 3.0, 0.2, 4.0])
    x = np.asarray(jr.normal(jr.key(2), (4, 5, 2))) * np.asarray(scales)[:, None, None]
    measures = jax.vmap(mf.Particles)(jnp.asarray(x))
    attn = mf.UnnormalizedAttention(eye, A=eye)
    queue, vmap = _both(measures, attn, 0.5, saveat=np.linspace(0, 0.5, 6))
    assert set(queue.status) == {"success", "blowup"}
    _assert_same(queue, vmap, 1e-12)
    for i in range(4):
        one = mf.simulate(mf.Particles(x[i]), attn, 0.5, saveat=np.linspace(0, 0.5, 6))
        assert one.status == queue.status[i]
        np.testing.assert_allclose(queue.blowup_time[i], one.blowup_time, rtol=1e-12)
    short, lock = _both(measures, attn, 0.5, max_steps=2)
    assert "max_steps" in set(short.status)
    _assert_same(short, lock, 1e-12)


@pytest.mark.slow
def test_the_queue_gives_each_system_its_own_simulate():
    """More systems than slots: refilled slots start from their own state."""
    from meanfield import _ensemble_queue

    betas = jnp.linspace(0.2, 6.0, 9)
    attn = jax.vmap(lambda b: mf.SoftmaxAttention(jnp.eye(2), A=b * jnp.eye(2)))(betas)
    measures = _systems(9, 4, 2, seed=3)
    old = _ensemble_queue.PAIRS_PER_STEP
    _ensemble_queue.PAIRS_PER_STEP = 2 * 16  # two slots for nine systems
    try:
        sol = mf.simulate_ensemble(
            measures, attn, 5.0, normalization="sphere", scheduling="queue"
        )
    finally:
        _ensemble_queue.PAIRS_PER_STEP = old
    for i in range(9):
        one = mf.simulate(
            mf.Particles(measures.x[i]),
            mf.SoftmaxAttention(jnp.eye(2), A=betas[i] * jnp.eye(2)),
            5.0,
            normalization="sphere",
        )
        assert int(one.num_steps) == int(sol.num_steps[i])
        np.testing.assert_allclose(sol.x[i], one.x, rtol=0, atol=1e-13)


def test_scheduling_is_checked():
    measures = _systems(2, 3, 2)
    attn = mf.SoftmaxAttention(jnp.eye(2), A=jnp.eye(2))
    with pytest.raises(ValueError, match="`scheduling` must be one of"):
        mf.simulate_ensemble(measures, attn, 1.0, scheduling="fast")
    with pytest.raises(ValueError, match='`scheduling="queue"` needs'):
        mf.simulate_ensemble(
            measures, attn, 1.0, scheduling="queue", solver="euler", dt0=0.1
        )
    with pytest.raises(ValueError, match='`scheduling="queue"` needs'):
        mf.simulate_ensemble(
            measures,
            attn,
            1.0,
            scheduling="queue",
            noise=mf.IndependentNoise(0.1),
            key=jr.key(0),
            solver="euler",
            dt0=0.1,
            normalization="sphere",
        )


@pytest.mark.slow
@pytest.mark.parametrize(
    "noise, normalization",
    [
        (jax.vmap(mf.IndependentNoise)(jnp.linspace(0.1, 0.4, 7)), None),
        (mf.IndependentNoise(0.3), "sphere"),
        (mf.CommonNoise(0.3), None),
    ],
)
def test_a_noisy_queue_follows_the_same_brownian_paths(noise, normalization):
    """Two slots for seven systems, each on the Brownian path of its key in
    `jr.split(key, B)`; additive noise with one sigma per system, and
    multiplicative noise. The schedulings' arithmetic differs by rounding, which
    moves an accepted step's end by an ulp and the Brownian bridge there by its
    square root: they agree to the scheme's pathwise error only (~ tol^(1/2)).
    Against another key's paths, their difference must be ten times smaller."""
    from meanfield import _ensemble_queue

    betas = jnp.linspace(0.5, 3.0, 7)
    attn = jax.vmap(lambda b: mf.SoftmaxAttention(jnp.eye(3), A=b * jnp.eye(3)))(betas)
    measures = _systems(7, 4, 3, seed=6)
    options = dict(noise=noise, normalization=normalization, rtol=1e-4, atol=1e-4)
    old = _ensemble_queue.PAIRS_PER_STEP
    _ensemble_queue.PAIRS_PER_STEP = 2 * 16
    try:
        queue, vmap = _both(measures, attn, 0.5, key=jr.key(3), **options)
    finally:
        _ensemble_queue.PAIRS_PER_STEP = old
    other = mf.simulate_ensemble(
        measures, attn, 0.5, key=jr.key(4), scheduling="vmap", **options
    )
    np.testing.assert_array_equal(queue.result, vmap.result)
    np.testing.assert_array_equal(queue.ts, vmap.ts)
    same_paths = np.max(np.abs(queue.x[:, -1] - vmap.x[:, -1]))
    other_paths = np.max(np.abs(other.x[:, -1] - vmap.x[:, -1]))
    assert same_paths < 0.1 * other_paths, (same_paths, other_paths)


@pytest.mark.parametrize("masked", [False, True])
def test_the_small_softmax_field_is_softmax_attention(masked):
    """Unit tokens, unequal weights, query/key pair, time-dependent V: 1e-13."""
    rng = np.random.default_rng(4)
    n, d = 7, 3
    x = rng.normal(size=(n, d))
    x /= np.linalg.norm(x, axis=1, keepdims=True)
    w = rng.random(n) + 0.1
    w[2] = 0.0
    w /= w.sum()
    Q, K = rng.normal(size=(2, d)), rng.normal(size=(2, d))
    V0 = rng.normal(size=(d, d))
    attn = mf.SoftmaxAttention(lambda t: (1 + t) * jnp.asarray(V0), Q=Q, K=K)
    if masked:
        mu = mf.MaskedParticles(x, rng.random(n), weights=w)
    else:
        mu = mf.Particles(x, weights=w)
    ours, ok = SmallSoftmax(attn).velocity_and_status(mu, t=0.3)
    np.testing.assert_allclose(ours, attn.velocity(mu, t=0.3), rtol=0, atol=1e-13)
    assert bool(ok)


def _repelling_pair():
    """A = -I and A = -500 I in float64 (LIMIT 283): the second's diagonal logit
    lies more than 3 LIMIT below its bound |A theta| = 500."""
    betas = jnp.array([1.0, 500.0])
    attn = jax.vmap(lambda b: mf.SoftmaxAttention(jnp.eye(2), A=-b * jnp.eye(2)))(betas)
    return attn, _systems(2, 5, 2, seed=3)


def test_a_shift_that_could_underflow_is_flagged():
    attn, measures = _repelling_pair()
    x = measures.x / jnp.linalg.norm(measures.x, axis=-1, keepdims=True)
    flags = []
    for k in range(2):
        one = SmallSoftmax(jax.tree.map(lambda a, k=k: a[k], attn))
        flags.append(bool(one.velocity_and_status(mf.Particles(x[k]))[1]))
    assert flags == [True, False]


@pytest.mark.slow
def test_a_flagged_system_is_solved_by_simulate():
    """The flagged system goes to `simulate`; its neighbour stays in the queue."""
    attn, measures = _repelling_pair()
    queue, vmap = _both(measures, attn, 0.05, normalization="sphere")
    _assert_same(queue, vmap, atol=1e-12)
    np.testing.assert_array_equal(queue.num_steps, vmap.num_steps)


@pytest.mark.slow
def test_short_axis_helpers_equal_their_numpy_forms():
    rng = np.random.default_rng(5)
    for d in (1, 2, 3, 8, 9):
        a = rng.normal(size=(4, 5, d)) * 10.0 ** rng.integers(-3, 3, size=(4, 5, 1))
        M = rng.normal(size=(6, d))
        np.testing.assert_allclose(last_axis_sum(a), a.sum(-1), rtol=1e-14)
        np.testing.assert_allclose(matmul_small(a, M), a @ M.T, rtol=1e-13)
        np.testing.assert_allclose(row_norms(a), np.linalg.norm(a, axis=-1), rtol=1e-15)
    huge = np.array([[1e300, 1e300], [3.0, 4.0]])
    np.testing.assert_allclose(row_norms(huge), [np.sqrt(2) * 1e300, 5.0])
