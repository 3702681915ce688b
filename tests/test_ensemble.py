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


def _assert_members_are_solo_solves(ens, xs, attn_of, t1, **opts):
    """Each member's status, times and saves equal its own `simulate`'s."""
    for b in range(len(xs)):
        one = mf.simulate(mf.Particles(xs[b]), attn_of(b), t1, **opts)
        assert ens.status[b] == one.status, b
        assert int(ens.num_steps[b]) == int(one.num_steps), b
        # Solver tolerance (here rounding: one step sequence, vmapped or not).
        for got, want in [(ens.blowup_time[b], one.blowup_time), (ens.ts[b], one.ts)]:
            np.testing.assert_allclose(got, want, rtol=1e-10, atol=0)
        reached = np.isfinite(np.asarray(one.x))
        np.testing.assert_array_equal(np.isfinite(ens.x[b]), reached)
        np.testing.assert_allclose(ens.x[b][reached], one.x[reached], atol=1e-8)


@pytest.mark.parametrize("saveat", [None, np.linspace(0, 5, 6)])
def test_a_member_that_stops_early_changes_no_other(saveat):
    """One member blows up at once, two run out of steps, one succeeds.

    Every member once reported a blow-up (or lost its last saves): diffrax's event
    root find, run for all members once one event fired, failed on the others.
    """
    z = np.asarray(jr.normal(jr.key(2), (4, 8, 3)))
    xs = z * np.array([0.1, 3.0, 0.4, 0.05])[:, None, None]
    betas = np.array([0.5, 1.0, 1.0, 0.0])
    eye = np.eye(3)
    attn_of = lambda b: mf.UnnormalizedAttention(eye, A=betas[b] * eye)  # noqa: E731
    opts = dict(saveat=saveat, max_steps=60)
    attn = jax.vmap(lambda b: mf.UnnormalizedAttention(eye, A=b * eye))(betas)
    ens = mf.simulate_ensemble(jax.vmap(mf.Particles)(xs), attn, 5.0, **opts)
    assert list(ens.status) == ["max_steps", "blowup", "max_steps", "success"]
    _assert_members_are_solo_solves(ens, xs, attn_of, 5.0, **opts)


def test_a_blowup_beside_healthy_members_with_one_shared_attention():
    # V = A = I in R^3, one system of large tokens: was ["blowup"] x 4.
    z = np.asarray(jr.normal(jr.key(3), (4, 8, 3)))
    xs = z * np.array([0.1, 3.0, 0.1, 0.1])[:, None, None]
    attn = mf.UnnormalizedAttention(np.eye(3), A=np.eye(3))
    opts = dict(saveat=np.linspace(0, 2, 5))
    ens = mf.simulate_ensemble(jax.vmap(mf.Particles)(xs), attn, 2.0, **opts)
    assert list(ens.status) == ["success", "blowup", "success", "success"]
    _assert_members_are_solo_solves(ens, xs, lambda b: attn, 2.0, **opts)


def test_a_step_floor_beside_an_event_is_failed_in_the_member_alone():
    # atol = 1e-300 is met by tokens of size 1e-295 only: the others end at
    # the step floor, without growth ("failed"), or blow up at once (flagged).
    z = np.asarray(jr.normal(jr.key(2), (3, 8, 3)))
    xs = z * np.array([1e-295, 3.0, 1.0])[:, None, None]
    betas = np.array([0.0, 1.0, 0.0])
    eye = np.eye(3)
    attn = jax.vmap(lambda b: mf.UnnormalizedAttention(eye, A=b * eye))(betas)
    opts = dict(rtol=0.0, atol=1e-300)
    ens = mf.simulate_ensemble(jax.vmap(mf.Particles)(xs), attn, 1.0, **opts)
    assert list(ens.status) == ["success", "blowup", "failed"]
    attn_of = lambda b: mf.UnnormalizedAttention(eye, A=betas[b] * eye)  # noqa: E731
    _assert_members_are_solo_solves(ens, xs, attn_of, 1.0, **opts)


def test_ensemble_checks_every_system_as_simulate_does():
    # Inside the vmap these checks could not raise: a zero token made every
    # member "blowup", a start beyond the radius was "success".
    xs, _ = _systems()
    xs = np.array(xs)
    xs[3, 1] = 0.0
    attn = mf.SoftmaxAttention(jnp.eye(D), A=jnp.eye(D))
    measures = jax.vmap(mf.Particles)(xs)
    for normalization in ("sphere", "pre-ln"):
        with pytest.raises(ValueError, match=r"`measures` .* systems \[3\] hold one"):
            mf.simulate_ensemble(measures, attn, 1.0, normalization=normalization)
    radius = float(np.linalg.norm(xs[2], axis=-1).max())
    with pytest.raises(ValueError, match=r"`blowup_radius` must exceed every system"):
        mf.simulate_ensemble(measures, attn, 1.0, blowup_radius=radius)


def test_ensemble_rejects_bad_input():
    xs, betas = _systems()
    attn = mf.SoftmaxAttention(jnp.eye(D), A=jnp.eye(D))
    with pytest.raises(ValueError, match="batch axis"):
        mf.simulate_ensemble(mf.Particles(xs[0]), attn, 1.0)
    measures = jax.vmap(mf.Particles)(xs)
    # Once silently truncated, an AttributeError inside diffrax, "range() arg 3
    # must not be zero", an IndexError, a ConcretizationTypeError.
    for kwargs, match in [
        (dict(max_steps=2.7), r"`max_steps` must be an integer >= 1; got 2.7"),
        (dict(chunk_size=2.5), r"`chunk_size` must be an integer >= 1; got 2.5"),
        (dict(adjoint="forward"), r"`adjoint` must be a diffrax adjoint"),
        (dict(reduce=lambda sol: sol.t_final.mean()), r"`reduce` must return"),
    ]:
        with pytest.raises(ValueError, match=match):
            mf.simulate_ensemble(measures, attn, 1.0, **kwargs)
    with pytest.raises(ValueError, match=r"at least one system; got B = 0"):
        mf.simulate_ensemble(jax.vmap(mf.Particles)(xs[:0]), attn, 1.0)
    traced = jax.jit(lambda t: mf.simulate_ensemble(measures, attn, t).x)
    with pytest.raises(ValueError, match=r"`t1` must be a concrete number"):
        traced(1.0)
    four = jax.vmap(lambda b: mf.SoftmaxAttention(jnp.eye(D), A=b * jnp.eye(D)))(
        betas[:4]
    )
    with pytest.raises(ValueError, match=r"must have leading size B = 5"):
        mf.simulate_ensemble(measures, four, 1.0)
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


# Slow tier: the default tier runs its chunks side by side wherever a test passes
# `chunk_size` (one stream per core).
@pytest.mark.slow
def test_chunks_side_by_side_give_the_chunks_one_after_the_other(monkeypatch):
    """Three concurrent streams, and chunks cut to give each stream one: the same
    result, bit for bit, as one chunk after the other."""
    from meanfield import _ensemble

    xs, betas = _systems()
    eye = jnp.eye(D)
    attn = jax.vmap(lambda b: mf.SoftmaxAttention(eye, A=b * eye))(betas)
    measures = jax.vmap(mf.Particles)(xs)

    def solve(streams, **options):
        monkeypatch.setattr(_ensemble, "concurrent_chunks", lambda: streams)
        return mf.simulate_ensemble(
            measures, attn, 2.0, normalization="sphere", **options
        )

    one_stream = solve(1, chunk_size=2)
    np.testing.assert_array_equal(solve(3, chunk_size=2).x, one_stream.x)
    monkeypatch.setattr(_ensemble, "MIN_CONCURRENT_CHUNK", 2)
    cut = solve(3)  # B = 5 cut into two chunks of 3
    np.testing.assert_array_equal(cut.x, solve(1).x)
    np.testing.assert_array_equal(cut.num_steps, one_stream.num_steps)


@pytest.mark.slow
def test_traced_systems_stay_in_one_stream(monkeypatch):
    """Under jax.jit the chunks are traced in the caller's thread, in lockstep."""
    from meanfield import _ensemble

    monkeypatch.setattr(_ensemble, "concurrent_chunks", lambda: 3)
    xs, betas = _systems()
    eye = jnp.eye(D)
    attn = jax.vmap(lambda b: mf.SoftmaxAttention(eye, A=b * eye))(betas)
    measures = jax.vmap(mf.Particles)(xs)
    options = dict(normalization="sphere", chunk_size=2, scheduling="vmap")
    jitted = jax.jit(lambda m: mf.simulate_ensemble(m, attn, 2.0, **options).x)
    plain = mf.simulate_ensemble(measures, attn, 2.0, **options)
    np.testing.assert_allclose(jitted(measures), plain.x, rtol=0, atol=1e-12)
