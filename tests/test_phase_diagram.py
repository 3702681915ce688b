"""Pair alignment, the equiangular ODE and clustering phase diagrams.

Geshkovski, Letrouit, Polyanskiy & Rigollet ("A mathematical perspective on
Transformers", 2023): n tokens with equal pairwise inner products rho stay
equiangular on the sphere, rho' = 2 (1 - rho) ((n - 1) rho + 1) /
(e^{beta (1 - rho)} + n - 1) (docs/math/clusters.md).
"""

import itertools

import jax.numpy as jnp
import jax.random as jr
import numpy as np
import pytest
from scipy.integrate import solve_ivp

import meanfield as mf
from meanfield.clustering import equiangular_rate, equiangular_time, pair_alignment


def _naive_alignment(x, eps):
    theta = x / np.linalg.norm(x, axis=-1, keepdims=True)
    n = len(x)
    pairs = [
        theta[i] @ theta[j] > 1 - eps
        for i, j in itertools.product(range(n), range(n))
        if i != j
    ]
    return np.mean(pairs)


def test_pair_alignment_matches_a_double_loop():
    rng = np.random.default_rng(0)
    x = rng.normal(size=(3, 4, 6, 2))
    x[0, 1, 2] = x[0, 1, 4] * 3.0  # one aligned pair, at another radius
    x[1, 2, :3] = x[1, 2, 3]  # four tokens on one direction
    got = np.asarray(pair_alignment(x, eps=1e-6))
    want = np.array(
        [[[_naive_alignment(x[a, b, :, :], 1e-6)] for b in range(4)] for a in range(3)]
    )[..., 0]
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-15)
    assert got[0, 1] == pytest.approx(2 / 30) and got[1, 2] == pytest.approx(12 / 30)
    x[2, 0, 1, 0] = np.inf  # a save after a blow-up
    assert np.isnan(pair_alignment(x)[2, 0])
    with pytest.raises(ValueError, match="eps"):
        pair_alignment(x, eps=0.0)


def _equiangular_solve(beta, n, t1, *, rtol, **options):
    """SciPy DOP853 on the scalar ODE from rho = 0 (atol 1e-14)."""
    return solve_ivp(
        lambda t, r: equiangular_rate(r, beta, n),
        (0, t1),
        [0.0],
        method="DOP853",
        rtol=rtol,
        atol=1e-14,
        **options,
    )


@pytest.mark.parametrize("beta", [0.5, 4.0])
def test_equiangular_tokens_follow_the_scalar_ode(beta):
    """n = 4 orthonormal tokens in d = 4 (rho0 = 0) under the sphere dynamics."""
    n = 4
    ts = np.linspace(0, 6, 13)
    eye = jnp.eye(n)
    sol = mf.simulate(
        mf.Particles(eye),
        mf.SoftmaxAttention(eye, A=beta * eye),
        6.0,
        saveat=ts,
        normalization="sphere",
        rtol=1e-12,
        atol=1e-12,
    )
    gram = np.einsum("tid,tjd->tij", np.asarray(sol.x), np.asarray(sol.x))
    off = gram[:, ~np.eye(n, dtype=bool)]  # (T, n(n-1)): all equal
    assert np.max(np.ptp(off, axis=1)) < 1e-10
    ref = _equiangular_solve(beta, n, 6.0, t_eval=ts, rtol=1e-13)
    np.testing.assert_allclose(off[:, 0], ref.y[0], rtol=0, atol=1e-9)


def test_equiangular_time_is_the_ode_hitting_time():
    beta, n, eps = 3.0, 32, 1e-3
    hit = lambda t, r: r[0] - (1 - eps)  # noqa: E731
    hit.terminal = True
    ref = _equiangular_solve(beta, n, 1e3, events=hit, rtol=1e-12)
    assert equiangular_time(beta, n, eps) == pytest.approx(ref.t_events[0][0], rel=1e-8)
    with pytest.raises(ValueError, match="rho0"):
        equiangular_time(beta, n, eps, rho0=-0.5)


@pytest.mark.parametrize("masked", [False, True])
def test_phase_diagram_is_the_mean_alignment_of_its_systems(masked):
    """Chunks of 3 (the last one padded) against one `simulate` per system."""
    betas, systems, n, d = np.array([1.0, 6.0]), 4, 6, 2
    ts = np.linspace(0, 8, 5)
    pd = mf.clustering.phase_diagram(
        betas,
        n=n,
        d=d,
        systems=systems,
        t1=8.0,
        saveat=ts,
        key=jr.key(3),
        masked=masked,
        chunk_size=3,
        rtol=1e-5,
        atol=1e-5,
    )
    assert pd.density.shape == (2, 5) and pd.one_cluster.shape == (2, 5)
    np.testing.assert_array_equal(pd.completed, [1.0, 1.0])
    x = jr.normal(jr.key(3), (2 * systems, n, d))
    x = x / jnp.linalg.norm(x, axis=-1, keepdims=True)
    for k, beta in enumerate(betas):
        aligned = []
        for s in range(systems):
            tokens = x[k * systems + s]
            measure = (
                mf.MaskedParticles(tokens, jnp.arange(n) / n)
                if masked
                else mf.Particles(tokens)
            )
            one = mf.simulate(
                measure,
                mf.SoftmaxAttention(jnp.eye(d), A=beta * jnp.eye(d)),
                8.0,
                saveat=ts,
                normalization="sphere",
                rtol=1e-5,
                atol=1e-5,
            )
            aligned.append(np.asarray(pair_alignment(one.x)))
        aligned = np.array(aligned)
        np.testing.assert_allclose(pd.density[k], aligned.mean(0), atol=1e-12)
        np.testing.assert_allclose(pd.one_cluster[k], (aligned == 1).mean(0))
    assert pd.theory().shape == (2,) and np.all(np.diff(pd.theory()) > 0)


def test_heads_split_the_coordinates_into_blocks():
    """Gamma = sum_h P_h Gamma_h, head h seeing block h only (a NumPy double loop)."""
    beta, n, d, heads = 2.5, 7, 6, 3
    x = np.asarray(jr.normal(jr.key(1), (n, d)))
    attn = mf.clustering.head_attention(jnp.asarray(beta), d, heads=heads)
    got = np.asarray(attn.velocity(mf.Particles(jnp.asarray(x))))
    want = np.zeros((n, d))
    for h in range(heads):
        block = slice(2 * h, 2 * h + 2)
        for i in range(n):
            logits = np.array([beta * x[i, block] @ x[j, block] for j in range(n)])
            w = np.exp(logits - logits.max())
            want[i, block] = (w / w.sum()) @ x[:, block]
    np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-14)
    with pytest.raises(ValueError, match="`heads` must divide d = 6"):
        mf.clustering.phase_diagram([1.0], d=6, heads=4)


def test_systems_that_stop_early_are_reported_not_averaged():
    """Unnormalised attention in R^d blows up at t ~ E1(beta) / 2: 2e-4 at beta = 6."""
    pd = mf.clustering.phase_diagram(
        [0.2, 6.0],
        n=4,
        systems=3,
        t1=0.05,
        saveat=np.linspace(0, 0.05, 3),
        attention="unnormalized",
        normalization=None,
        rtol=1e-5,
        atol=1e-5,
    )
    np.testing.assert_array_equal(pd.completed, [1.0, 0.0])
    assert np.all(np.isfinite(pd.density[0])) and np.all(np.isnan(pd.density[1, 1:]))
    np.testing.assert_array_equal(pd.one_cluster[1], 0.0)


def test_a_beta_whose_systems_partly_blow_up_averages_the_completed_ones():
    """Unnormalised attention in R^2 at beta = 0.05, t1 = 2.2: 3 of 8 systems
    reach t1 alone. The blow-ups of the others once made every system of the
    ensemble report one: completed 0, density all NaN."""
    n, d, systems, ts = 8, 2, 8, np.linspace(0, 2.2, 12)
    pd = mf.clustering.phase_diagram(
        [0.05],
        n=n,
        d=d,
        systems=systems,
        t1=2.2,
        saveat=ts,
        attention="unnormalized",
        normalization=None,
        rtol=1e-5,
        atol=1e-5,
    )
    x = jr.normal(jr.key(0), (systems, n, d))
    x = x / jnp.linalg.norm(x, axis=-1, keepdims=True)
    attn = mf.clustering.head_attention(jnp.asarray(0.05), d, "unnormalized")
    solos = [
        mf.simulate(mf.Particles(x[s]), attn, 2.2, saveat=ts, rtol=1e-5, atol=1e-5)
        for s in range(systems)
    ]
    done = np.array([one.status == "success" for one in solos])
    assert done.sum() == 3
    np.testing.assert_array_equal(pd.completed, [3 / 8])
    aligned = np.array([pair_alignment(one.x) for one in solos])[done]
    np.testing.assert_allclose(pd.density[0], aligned.mean(0), atol=1e-12)
