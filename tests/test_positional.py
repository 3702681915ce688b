"""ALiBi and RoPE attention against NumPy double loops, on masked particles.

The references write the logits as the papers do, with both positions:
ALiBi <A x_i, x_j> - slope (s_i - s_j) (Press, Smith & Lewis, 2022) and RoPE
<Q x_i, R(s_j - s_i) K x_j> with R an explicit block-rotation matrix (Su et al.,
2021), then normalise over the visible keys s_j <= s_i with weights w_j. The
unnormalised variant of Duerinckx, Geshkovski & Rossi (arXiv 2605.09213)
normalises the positional weights alone.
Values at 1e-12 in float64, derivatives by the complex step of the same loops.
"""

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import meanfield as mf

TOL = dict(rtol=1e-12, atol=1e-12)
N, D, K = 9, 4, 4
STEP = 1e-30


@pytest.fixture(scope="module")
def data():
    rng = np.random.default_rng(5)
    s = np.concatenate([[0.0], np.sort(rng.uniform(size=N - 2)), [1.0]])
    return dict(
        x=rng.normal(size=(N, D)),
        w=rng.dirichlet(np.ones(N)),
        s=s,
        V=rng.normal(size=(D, D)),
        A=0.5 * rng.normal(size=(D, D)),
        Q=0.5 * rng.normal(size=(K, D)),
        K=0.5 * rng.normal(size=(K, D)),
        omega=np.array([3.0, 17.0]),
        z=rng.normal(size=(N, D)),
        zs=rng.uniform(size=N),
        e=rng.normal(size=(N, D)),
    )


def rotation(phi, omega):
    """R(phi): the rotation by omega_p phi of each coordinate pair (2p, 2p+1)."""
    R = np.zeros((2 * len(omega), 2 * len(omega)))
    for p, om in enumerate(omega):
        c, s = np.cos(om * phi), np.sin(om * phi)
        R[2 * p : 2 * p + 2, 2 * p : 2 * p + 2] = [[c, -s], [s, c]]
    return R


def positional_numpy(z, zs, x, s, w, V, logit):
    """sum_{s_j <= zs_i} w_j e^{l_ij} V x_j / Z_i with l_ij = logit(i, j)."""
    out = np.zeros(z.shape, dtype=np.result_type(z, x))
    for i in range(z.shape[0]):
        visible = [j for j in range(x.shape[0]) if s[j] <= zs[i]]
        if not visible:
            continue
        logits = np.array(
            [logit(z[i], zs[i], x[j], s[j]) + np.log(w[j]) for j in visible]
        )
        p = np.exp(logits - logits.real.max())
        p = p / p.sum()
        for pj, j in zip(p, visible, strict=True):
            out[i] += pj * (V @ x[j])
    return out


def alibi_logit(A, slope):
    return lambda zi, si, xj, sj: (A @ zi) @ xj - slope * (si - sj)


def rope_logit(Q, K, omega):
    return lambda zi, si, xj, sj: (Q @ zi) @ (rotation(sj - si, omega) @ (K @ xj))


def _cases(d):
    return {
        "alibi": (
            lambda **kw: mf.ALiBiAttention(d["V"], A=d["A"], slope=2.5, **kw),
            alibi_logit(d["A"], 2.5),
        ),
        "rope": (
            lambda **kw: mf.RoPEAttention(
                d["V"], Q=d["Q"], K=d["K"], frequencies=d["omega"], **kw
            ),
            rope_logit(d["Q"], d["K"], d["omega"]),
        ),
    }


NAMES = ["alibi", "rope"]


@pytest.mark.parametrize("name", NAMES)
def test_values_at_the_atoms_and_elsewhere_match_the_loop(data, name):
    d = data
    make, logit = _cases(d)[name]
    mu = mf.MaskedParticles(d["x"], d["s"], d["w"])
    attn = make()
    ref = positional_numpy(d["x"], d["s"], d["x"], d["s"], d["w"], d["V"], logit)
    np.testing.assert_allclose(attn.velocity(mu), ref, **TOL)
    at_z = positional_numpy(d["z"], d["zs"], d["x"], d["s"], d["w"], d["V"], logit)
    np.testing.assert_allclose(
        attn.velocity_at(mu, d["z"], positions=d["zs"]), at_z, **TOL
    )


@pytest.mark.parametrize("name", NAMES)
def test_derivatives_match_the_complex_step_of_the_loop(data, name):
    d = data
    make, logit = _cases(d)[name]
    attn = make()
    mu = mf.MaskedParticles(d["x"], d["s"], d["w"])

    def velocity(y):
        return attn.velocity(eqx.tree_at(lambda m: m.x, mu, y))

    _, tangent = jax.jvp(velocity, (jnp.asarray(d["x"]),), (jnp.asarray(d["e"]),))

    def ref(y):
        return positional_numpy(y, d["s"], y, d["s"], d["w"], d["V"], logit)

    fd = ref(d["x"] + 1j * STEP * d["e"]).imag / STEP
    np.testing.assert_allclose(tangent, fd, **TOL)


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("blocking", ["blocked", "fused"])
def test_blocked_and_fused_kernels_match_dense(data, name, blocking):
    d = data
    make, _ = _cases(d)[name]
    mu = mf.MaskedParticles(d["x"], d["s"], d["w"])
    dense = make(blocking="dense").velocity(mu)
    other = make(blocking=blocking, block_size=2).velocity(mu)
    np.testing.assert_allclose(other, dense, **TOL)


def test_alibi_slope_favours_recent_tokens(data):
    # slope -> inf: the query attends to its own position only (the last
    # visible key), slope 0: plain causal softmax.
    d = data
    mu = mf.MaskedParticles(d["x"], d["s"], d["w"])
    steep = mf.ALiBiAttention(d["V"], A=d["A"], slope=1e4).velocity(mu)
    np.testing.assert_allclose(steep, d["x"] @ d["V"].T, rtol=1e-10, atol=1e-10)
    flat = mf.ALiBiAttention(d["V"], A=d["A"], slope=0.0).velocity(mu)
    np.testing.assert_allclose(
        flat, mf.SoftmaxAttention(d["V"], A=d["A"]).velocity(mu), **TOL
    )


def test_rope_is_relative_and_reduces_to_softmax_at_equal_positions(data):
    d = data
    make, _ = _cases(d)["rope"]
    attn = make()
    shifted = mf.MaskedParticles(d["x"], 0.5 * d["s"] + 0.3, d["w"])
    halved = mf.MaskedParticles(d["x"], 0.5 * d["s"], d["w"])
    np.testing.assert_allclose(attn.velocity(shifted), attn.velocity(halved), **TOL)
    same = mf.MaskedParticles(d["x"], np.full(N, 0.7), d["w"])
    softmax = mf.SoftmaxAttention(d["V"], Q=d["Q"], K=d["K"])
    np.testing.assert_allclose(
        attn.velocity(same), softmax.velocity(mf.Particles(d["x"], d["w"])), **TOL
    )


@pytest.mark.parametrize("name", NAMES)
def test_needs_positions_and_float32_works(data, name):
    d = data
    make, _ = _cases(d)[name]
    with pytest.raises(
        ValueError, match="needs token positions: pass `MaskedParticles"
    ):
        make().velocity(mf.Particles(d["x"], d["w"]))
    mu32 = mf.MaskedParticles(*(d[k].astype(np.float32) for k in ("x", "s", "w")))
    v = make().velocity(mu32)
    assert v.dtype == jnp.float32
    ref = make().velocity(mf.MaskedParticles(d["x"], d["s"], d["w"]))
    # float32 rounding (eps 1.2e-7) of O(1) logits and values, through a
    # softmax of 9 keys: errors ~1e-6 measured; 1e-5 / 1e-4 leave a margin of 10.
    np.testing.assert_allclose(v, ref, rtol=1e-4, atol=1e-5)


def test_vmap_and_simulate(data):
    d = data
    make, _ = _cases(d)["alibi"]
    attn = make()
    xs = np.stack([d["x"], d["z"]])
    batched = jax.vmap(lambda y: attn.velocity(mf.MaskedParticles(y, d["s"], d["w"])))(
        xs
    )
    for b in range(2):
        one = attn.velocity(mf.MaskedParticles(xs[b], d["s"], d["w"]))
        np.testing.assert_allclose(batched[b], one, **TOL)
    sol = mf.simulate(
        mf.MaskedParticles(d["x"], d["s"]), attn, t1=0.5, normalization="sphere"
    )
    assert sol.status == "success"
    np.testing.assert_allclose(np.linalg.norm(sol.x[-1], axis=1), 1, rtol=1e-12)


def test_bad_parameters_are_named():
    eye = np.eye(4)
    with pytest.raises(ValueError, match="`slope` must be a number"):
        mf.ALiBiAttention(eye, A=eye, slope=np.ones(2))
    with pytest.raises(ValueError, match="even number of rows"):
        mf.RoPEAttention(np.eye(3), Q=np.eye(3), K=np.eye(3), frequencies=[1.0])
    with pytest.raises(ValueError, match=r"`frequencies` must have shape \(k/2,\)"):
        mf.RoPEAttention(eye, Q=eye, K=eye, frequencies=[1.0, 2.0, 3.0])


def unnormalized_alibi_numpy(z, zs, x, s, w, V, A, slope, include_self=True):
    """sum_j pi_ij e^{<A z_i, x_j>} V x_j, pi_ij = w_j e^{-slope (zs_i - s_j)} / D_i."""
    out = np.zeros(z.shape, dtype=np.result_type(z, x))
    for i in range(z.shape[0]):
        visible = [
            j
            for j in range(x.shape[0])
            if (s[j] <= zs[i] if include_self else s[j] < zs[i])
        ]
        pos = np.array([w[j] * np.exp(-slope * (zs[i] - s[j])) for j in visible])
        for pj, j in zip(pos / max(pos.sum(), 1e-300), visible, strict=True):
            out[i] += pj * np.exp((A @ z[i]) @ x[j]) * (V @ x[j])
    return out


@pytest.mark.parametrize("include_self", [True, False], ids=["self", "strict"])
def test_unnormalized_alibi_matches_the_loop(data, include_self):
    d = data
    attn = mf.UnnormalizedALiBiAttention(
        d["V"], A=d["A"], slope=2.5, include_self=include_self
    )
    mu = mf.MaskedParticles(d["x"], d["s"], d["w"])

    def ref(z, zs, y=None):
        y = z if y is None else y
        return unnormalized_alibi_numpy(
            z, zs, y, d["s"], d["w"], d["V"], d["A"], 2.5, include_self
        )

    np.testing.assert_allclose(attn.velocity(mu), ref(d["x"], d["s"]), **TOL)
    np.testing.assert_allclose(
        attn.velocity_at(mu, d["z"], positions=d["zs"]),
        ref(d["z"], d["zs"], d["x"]),
        **TOL,
    )
    if not include_self:  # the first token sees no key
        assert np.all(np.asarray(attn.velocity(mu))[0] == 0)

    def velocity(y):
        return attn.velocity(eqx.tree_at(lambda m: m.x, mu, y))

    _, tangent = jax.jvp(velocity, (jnp.asarray(d["x"]),), (jnp.asarray(d["e"]),))
    fd = ref(d["x"] + 1j * STEP * d["e"], d["s"]).imag / STEP
    np.testing.assert_allclose(tangent, fd, **TOL)


def test_unnormalized_alibi_on_the_circle_is_the_papers_angle_field(data):
    # theta_i' = sum_{j<i} W_ij beta sin(theta_j - theta_i) e^{beta cos(theta_i -
    # theta_j)}, W_ij = e^{-lam (i - j)/n} / sum_{j'<i} e^{-lam (i - j')/n}.
    n, beta, lam = 12, 1.5, 3.0
    theta = np.random.default_rng(7).uniform(0, 2 * np.pi, n)
    x = np.stack([np.cos(theta), np.sin(theta)], 1)
    attn = mf.UnnormalizedALiBiAttention(
        beta * np.eye(2), A=beta * np.eye(2), slope=lam, include_self=False
    )
    mu = mf.MaskedParticles(x, np.arange(n) / n)
    tangent = np.asarray(attn.sphere_velocity(mu))
    speed = tangent[:, 1] * x[:, 0] - tangent[:, 0] * x[:, 1]  # d theta / dt
    ref = np.zeros(n)
    for i in range(1, n):
        W = np.exp(-lam * (i - np.arange(i)) / n)
        W /= W.sum()
        for j in range(i):
            u = theta[i] - theta[j]
            ref[i] += W[j] * beta * np.sin(-u) * np.exp(beta * np.cos(u))
    np.testing.assert_allclose(speed, ref, rtol=1e-12, atol=1e-13)
    # The projection of the field, as `normalization="sphere"` without differences.
    v = np.asarray(attn.velocity(mu))
    projected = v - np.sum(v * x, axis=1, keepdims=True) * x
    np.testing.assert_allclose(tangent, projected, rtol=1e-12, atol=1e-13)


@pytest.mark.parametrize("name", NAMES)
def test_ensemble_of_masked_systems_matches_one_by_one(data, name):
    d = data
    make, _ = _cases(d)[name]
    attn = make()
    xs = np.stack([d["x"], d["z"]])
    systems = jax.vmap(lambda y: mf.MaskedParticles(y, d["s"], d["w"]))(xs)
    sols = mf.simulate_ensemble(systems, attn, 0.5, normalization="sphere")
    for b in range(2):
        one = mf.simulate(
            mf.MaskedParticles(xs[b], d["s"], d["w"]), attn, 0.5, normalization="sphere"
        )
        np.testing.assert_allclose(sols.x[b], one.x, rtol=1e-10, atol=1e-12)
