"""Feed-forward fields and Transformer blocks against NumPy double loops.

Values at 1e-12 in float64; derivatives by the complex step of the same loops
(f(x + i h e) / h, h = 1e-30: no cancellation, exact to rounding), so the
reference derivative shares no code with JAX's. `mf.layers` on a block converges
to `mf.simulate` at first order with the Transformer's (Lie) splitting and at
second order with Strang splitting.
"""

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest
import scipy.special

import meanfield as mf

TOL = dict(rtol=1e-12, atol=1e-12)
N, D, P = 7, 3, 5
STEP = 1e-30  # complex step


@pytest.fixture(scope="module")
def data():
    rng = np.random.default_rng(0)
    return dict(
        x=rng.normal(size=(N, D)),
        w=rng.dirichlet(np.ones(N)),
        s=np.sort(rng.uniform(size=N)),
        V=rng.normal(size=(D, D)),
        A=0.5 * rng.normal(size=(D, D)),
        W=rng.normal(size=(D, D)) / np.sqrt(D),
        b=rng.normal(size=D),
        W1=rng.normal(size=(P, D)),
        b1=rng.normal(size=P),
        W2=rng.normal(size=(D, P)) / np.sqrt(P),
        b2=rng.normal(size=D),
        e=rng.normal(size=(N, D)),
    )


def _activation(name, u):
    if name == "relu":
        return np.where(u.real > 0, u, 0)
    if name == "tanh":
        return np.tanh(u)
    return u * (1 + scipy.special.erf(u / np.sqrt(2))) / 2


def mlp_numpy(x, W1, b1, W2, b2, activation):
    """W2 sigma(W1 x_i + b1) + b2, one token at a time."""
    out = np.zeros(x.shape, dtype=x.dtype)
    for i in range(x.shape[0]):
        out[i] = W2 @ _activation(activation, W1 @ x[i] + b1) + b2
    return out


def softmax_numpy(x, w, V, A, s=None):
    """sum_j w_j e^{<A x_i, x_j>} V x_j / Z_i over s_j <= s_i (complex-safe)."""
    out = np.zeros(x.shape, dtype=x.dtype)
    for i in range(x.shape[0]):
        visible = [j for j in range(x.shape[0]) if s is None or s[j] <= s[i]]
        logits = np.array([(A @ x[i]) @ x[j] + np.log(w[j]) for j in visible])
        p = np.exp(logits - logits.real.max())
        p = p / p.sum()
        for pj, j in zip(p, visible, strict=True):
            out[i] += pj * (V @ x[j])
    return out


def unnormalized_numpy(x, w, V, A):
    """sum_j w_j e^{<A x_i, x_j>} V x_j, double loop."""
    out = np.zeros(x.shape, dtype=x.dtype)
    for i in range(x.shape[0]):
        for j in range(x.shape[0]):
            out[i] += w[j] * np.exp((A @ x[i]) @ x[j]) * (V @ x[j])
    return out


def complex_step(f, x, e):
    """Directional derivative of f at x along e, to rounding."""
    return f(x + 1j * STEP * e).imag / STEP


def _measure(d, masked):
    if masked:
        return mf.MaskedParticles(d["x"], d["s"], d["w"])
    return mf.Particles(d["x"], d["w"])


def _jvp(field, d, masked):
    """(velocity at the atoms, its derivative along e), through JAX."""
    measure = _measure(d, masked)

    def velocity(y):
        return field.velocity(eqx.tree_at(lambda m: m.x, measure, y))

    return jax.jvp(velocity, (jnp.asarray(d["x"]),), (jnp.asarray(d["e"]),))


def test_affine_feedforward_is_wx_plus_b(data):
    ff = mf.FeedForward(data["W"], data["b"])
    v = ff.velocity(mf.Particles(data["x"], data["w"]))
    np.testing.assert_allclose(v, data["x"] @ data["W"].T + data["b"], **TOL)
    # Without b, and at arbitrary points: the measure plays no part.
    z = data["e"]
    out = mf.FeedForward(data["W"]).velocity_at(mf.Particles(data["x"]), z)
    np.testing.assert_allclose(out, z @ data["W"].T, **TOL)


@pytest.mark.parametrize("activation", ["relu", "gelu", "tanh"])
def test_mlp_values_and_derivatives_match_the_loop(data, activation):
    d = data
    ff = mf.MLP(d["W1"], d["b1"], d["W2"], d["b2"], activation=activation)
    value, tangent = _jvp(ff, d, masked=False)

    def ref(y):
        return mlp_numpy(y, d["W1"], d["b1"], d["W2"], d["b2"], activation)

    np.testing.assert_allclose(value, ref(d["x"]), **TOL)
    np.testing.assert_allclose(tangent, complex_step(ref, d["x"], d["e"]), **TOL)


@pytest.mark.parametrize("masked", [False, True], ids=["plain", "masked"])
def test_block_is_attention_plus_feedforward(data, masked):
    d = data
    attn = mf.SoftmaxAttention(d["V"], A=d["A"])
    ff = mf.MLP(d["W1"], d["b1"], d["W2"], None, activation="tanh")
    block = mf.Block(attn, ff)
    value, tangent = _jvp(block, d, masked)
    s = d["s"] if masked else None

    def ref(y):
        attention = softmax_numpy(y, d["w"], d["V"], d["A"], s)
        return attention + mlp_numpy(y, d["W1"], d["b1"], d["W2"], 0.0, "tanh")

    np.testing.assert_allclose(value, ref(d["x"]), **TOL)
    np.testing.assert_allclose(tangent, complex_step(ref, d["x"], d["e"]), **TOL)


def test_block_with_time_dependent_feedforward(data):
    d = data
    W = mf.PiecewiseConstant(np.stack([d["W"], -d["W"]]), t0=0.0, t1=1.0)
    block = mf.Block(mf.SoftmaxAttention(d["V"], A=d["A"]), mf.FeedForward(W))
    mu = mf.Particles(d["x"], d["w"])
    attention = softmax_numpy(d["x"], d["w"], d["V"], d["A"])
    for t, sign in ((0.25, 1), (0.75, -1)):
        ref = attention + sign * d["x"] @ d["W"].T
        np.testing.assert_allclose(block.velocity(mu, t=t), ref, **TOL)


def test_block_on_the_sphere_projects_both_parts(data):
    # One post-LN layer: an attention sub-block, then a feed-forward one, each
    # x <- (x + h P_x^perp v) / |...|.
    d = data
    theta = d["x"] / np.linalg.norm(d["x"], axis=1, keepdims=True)
    for attn, field in (
        (mf.SoftmaxAttention(d["V"], A=d["A"]), softmax_numpy),
        (
            mf.UnnormalizedAttention(d["V"], A=d["A"]),
            lambda y, w, V, A: unnormalized_numpy(y, w, V, A),
        ),
    ):
        block = mf.Block(attn, mf.FeedForward(d["W"], d["b"]))
        h = 0.1
        sol = mf.layers(
            mf.Particles(theta, d["w"]), block, 1, t1=h, normalization="sphere"
        )
        x = theta
        for v in (
            lambda y, field=field: field(y, d["w"], d["V"], d["A"]),
            lambda y: y @ d["W"].T + d["b"],
        ):
            u = v(x)
            x = x + h * (u - np.sum(x * u, axis=1, keepdims=True) * x)
            x = x / np.linalg.norm(x, axis=1, keepdims=True)
        # The unnormalised family's tangent part comes from differences: equal
        # to rounding of O(1) quantities.
        np.testing.assert_allclose(sol.x[-1], x, rtol=1e-11, atol=1e-12)


def test_bad_arguments_are_named():
    with pytest.raises(ValueError, match="`W` must have shape"):
        mf.FeedForward(np.ones((2, 3)))
    with pytest.raises(ValueError, match="`b` must have shape"):
        mf.FeedForward(np.eye(2), np.ones(3))
    with pytest.raises(ValueError, match="`W2` must have shape"):
        mf.MLP(np.ones((4, 2)), None, np.ones((4, 2)))
    with pytest.raises(ValueError, match="`activation` must be one of"):
        mf.MLP(np.ones((4, 2)), None, np.ones((2, 4)), activation="swish")
    with pytest.raises(ValueError, match="`feedforward` must be"):
        mf.Block(mf.SoftmaxAttention(np.eye(2), A=np.eye(2)), np.eye(2))
    with pytest.raises(ValueError, match="`attention` must be an attention"):
        mf.Block(mf.FeedForward(np.eye(2)), mf.FeedForward(np.eye(2)))


def test_ensemble_of_blocks_matches_one_by_one(data):
    d = data
    block = mf.Block(mf.SoftmaxAttention(d["V"], A=d["A"]), mf.FeedForward(d["W"]))
    xs = np.stack([d["x"], d["e"]])
    sols = mf.simulate_ensemble(jax.vmap(mf.Particles)(xs), block, 0.5)
    for b in range(2):
        one = mf.simulate(mf.Particles(xs[b]), block, t1=0.5)
        np.testing.assert_allclose(sols.x[b], one.x, rtol=1e-10, atol=1e-12)


# Layers: splitting.


def test_lie_layer_is_an_attention_step_then_a_feedforward_step(data):
    d = data
    attn = mf.SoftmaxAttention(d["V"], A=d["A"])
    block = mf.Block(attn, mf.FeedForward(d["W"], d["b"]))
    h = 0.1
    sol = mf.layers(mf.Particles(d["x"], d["w"]), block, 2, t1=2 * h)
    x = d["x"]
    for _ in range(2):
        x = x + h * softmax_numpy(x, d["w"], d["V"], d["A"])
        x = x + h * (x @ d["W"].T + d["b"])
    np.testing.assert_allclose(sol.x[-1], x, **TOL)


def test_strang_needs_a_block_and_no_noise(data):
    mu = mf.Particles(data["x"])
    attn = mf.SoftmaxAttention(data["V"], A=data["A"])
    with pytest.raises(ValueError, match="composes the two fields of an `mf.Block`"):
        mf.layers(mu, attn, 2, splitting="strang")
    with pytest.raises(ValueError, match="`splitting` must be one of"):
        mf.layers(mu, attn, 2, splitting="yoshida")
    block = mf.Block(attn, mf.FeedForward(data["W"]))
    with pytest.raises(ValueError, match="deterministic second-order"):
        mf.layers(
            mu,
            block,
            2,
            splitting="strang",
            noise=mf.IndependentNoise(0.1),
            key=jax.random.key(0),
        )


@pytest.mark.parametrize(
    "normalization, splitting, order",
    [(None, "lie", 1), (None, "strang", 2), ("sphere", "strang", 2)],
)
def test_layers_converge_to_simulate_at_the_splitting_order(
    data, normalization, splitting, order
):
    # Error at t1 = 1 against a tight solve, L = 8 .. 64: the fitted log-log
    # slope is -order within 0.15 (the error constants vary little over this
    # range: the next term is O(h^{order+1})).
    d = data
    attn = mf.SoftmaxAttention(0.5 * d["V"], A=d["A"])
    ff = mf.MLP(d["W1"], d["b1"], 0.5 * d["W2"], d["b2"], activation="tanh")
    block = mf.Block(attn, ff)
    mu = mf.Particles(d["x"], d["w"])
    ref = mf.simulate(
        mu,
        block,
        t1=1.0,
        normalization=normalization,
        solver="dopri8",
        rtol=1e-12,
        atol=1e-12,
    ).x[-1]
    Ls = np.array([8, 16, 32, 64])
    errors = [
        np.max(
            np.abs(
                mf.layers(
                    mu, block, int(L), normalization=normalization, splitting=splitting
                ).x[-1]
                - ref
            )
        )
        for L in Ls
    ]
    slope = np.polyfit(np.log(Ls), np.log(errors), 1)[0]
    assert abs(slope + order) < 0.15, (slope, errors)
