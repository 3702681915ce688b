"""Ensembles of particle systems (`mf.simulate_ensemble`) against one solve each."""

import jax
import jax.numpy as jnp
import jax.random as jr
import numpy as np
import pytest

import meanfield as mf

B, N, D = 5, 7, 3


def _systems():
    xs = jr.normal(jr.key(0), (B, N, D))
    betas = jnp.linspace(0.5, 3.0, B)
    return xs, betas


@pytest.mark.parametrize("chunk_size", [None, 2])
def test_ensemble_equals_one_simulate_per_system(chunk_size):
    """Batched attentions (one beta per system); chunks of 2 pad the last chunk."""
    xs, betas = _systems()
    eye = jnp.eye(D)
    attn = jax.vmap(lambda b: mf.SoftmaxAttention(eye, A=b * eye))(betas)
    opts = dict(
        saveat=np.linspace(0, 4, 5), normalization="sphere", rtol=1e-9, atol=1e-9
    )
    sol = mf.simulate_ensemble(
        jax.vmap(mf.Particles)(xs), attn, 4.0, chunk_size=chunk_size, **opts
    )
    assert sol.x.shape == (B, 5, N, D) and sol.ts.shape == (B, 5)
    assert list(sol.status) == ["success"] * B
    for b in range(B):
        one = mf.simulate(
            mf.Particles(xs[b]), mf.SoftmaxAttention(eye, A=betas[b] * eye), 4.0, **opts
        )
        np.testing.assert_allclose(sol.x[b], one.x, rtol=0, atol=1e-8)
        assert int(sol.num_steps[b]) == int(one.num_steps)
        assert float(sol.t_final[b]) == float(one.t_final)


def test_ensemble_with_a_shared_attention_and_masked_measures():
    xs, _ = _systems()
    attn = mf.SoftmaxAttention(jnp.eye(D), A=2.0 * jnp.eye(D))
    s = jnp.broadcast_to(jnp.arange(N) / N, (B, N))
    sol = mf.simulate_ensemble(
        jax.vmap(mf.MaskedParticles)(xs, s), attn, 2.0, saveat=jnp.linspace(0, 2, 3)
    )
    for b in (0, B - 1):
        one = mf.simulate(
            mf.MaskedParticles(xs[b], s[b]), attn, 2.0, saveat=jnp.linspace(0, 2, 3)
        )
        np.testing.assert_allclose(sol.x[b], one.x, rtol=0, atol=1e-8)


def test_ensemble_reports_blowups_per_system():
    """Unnormalised attention: every system blows up, at its own time, and the
    ensemble reports each one as its single solve does."""
    xs, _ = _systems()
    betas = jnp.array([0.01, 0.02, 5.0, 0.01, 0.03])
    eye = jnp.eye(D)
    attn = jax.vmap(lambda b: mf.UnnormalizedAttention(eye, A=b * eye))(betas)
    sol = mf.simulate_ensemble(jax.vmap(mf.Particles)(3 * xs), attn, 10.0)
    for b in range(B):
        one = mf.simulate(
            mf.Particles(3 * xs[b]),
            mf.UnnormalizedAttention(eye, A=betas[b] * eye),
            10.0,
        )
        assert one.status == "blowup" and sol.status[b] == "blowup"
        assert float(sol.blowup_time[b]) == pytest.approx(
            float(one.blowup_time), rel=1e-8
        )


def test_ensemble_rejects_bad_input():
    xs, betas = _systems()
    attn = mf.SoftmaxAttention(jnp.eye(D), A=jnp.eye(D))
    with pytest.raises(ValueError, match="batch axis"):
        mf.simulate_ensemble(mf.Particles(xs[0]), attn, 1.0)
    wrong = jax.vmap(lambda b: mf.SoftmaxAttention(jnp.eye(D), A=b * jnp.eye(D)))(
        betas[:3]
    )
    with pytest.raises(ValueError, match="leading size B = 5"):
        mf.simulate_ensemble(
            jax.vmap(mf.Particles)(xs), wrong, 1.0, batched_attention=True
        )
    with pytest.raises(ValueError, match="chunk_size"):
        mf.simulate_ensemble(jax.vmap(mf.Particles)(xs), attn, 1.0, chunk_size=0)


def _final_radius(sol):
    """A reduction: the largest token norm at the last save (B,)."""
    return jnp.max(jnp.linalg.norm(sol.x[:, -1], axis=-1), axis=-1)


def test_reduce_runs_on_each_chunk_and_equals_reducing_everything():
    xs, betas = _systems()
    eye = jnp.eye(D)
    attn = jax.vmap(lambda b: mf.SoftmaxAttention(eye, A=b * eye))(betas)
    opts = dict(saveat=np.linspace(0, 1, 3), rtol=1e-9, atol=1e-9)
    measures = jax.vmap(mf.Particles)(xs)
    full = mf.simulate_ensemble(measures, attn, 1.0, **opts)
    got = mf.simulate_ensemble(
        measures, attn, 1.0, chunk_size=2, reduce=_final_radius, **opts
    )
    assert got.shape == (B,)
    # The same solves in chunks of another width: rounding only.
    np.testing.assert_allclose(got, _final_radius(full), rtol=1e-12, atol=0)
