"""Normalisation schemes (docs/math/particles.md) against independent NumPy solves.

The schemes are those compared by Karagodin, Polyanskiy & Rigollet and used by
pre-LN / peri-LN Transformers and nGPT (Loshchilov et al., 2024): each is the
continuous limit of a residual block, solved here by SciPy from a plain NumPy
softmax field, and `mf.layers` is checked against the blocks themselves.
"""

import jax.numpy as jnp
import numpy as np
import pytest
from scipy.integrate import solve_ivp

import meanfield as mf

N, D = 6, 3
RNG = np.random.default_rng(7)
X0 = RNG.normal(size=(N, D)) * RNG.uniform(0.5, 2.0, size=(N, 1))
A = RNG.normal(size=(D, D))
V = np.eye(D) + 0.3 * RNG.normal(size=(D, D))
ALPHA = 0.3


def _attention(z, keys):
    """Softmax attention of queries z over keys (uniform weights), value V."""
    logits = z @ A.T @ keys.T  # <A z, y>
    w = np.exp(logits - logits.max(axis=1, keepdims=True))
    w /= w.sum(axis=1, keepdims=True)
    return w @ keys @ V.T


def _unit(v):
    return v / np.linalg.norm(v, axis=-1, keepdims=True)


def _project(theta, v):
    return v - np.sum(theta * v, axis=-1, keepdims=True) * theta


def _field(x, scheme):
    if scheme is None:
        return _attention(x, x)
    theta = _unit(x)
    out = _attention(theta, theta)
    return {
        "sphere": lambda: _project(theta, out),
        "pre-ln": lambda: out,
        "peri-ln": lambda: _unit(out),
        "ngpt": lambda: ALPHA * _project(theta, _unit(out)),
    }[scheme]()


def _block(x, h, scheme):
    theta = _unit(x)
    if scheme == "ngpt":
        return _unit(theta + ALPHA * h * (_unit(_attention(theta, theta)) - theta))
    x_new = x + h * _field(x, scheme)
    return _unit(x_new) if scheme == "sphere" else x_new


def _attn():
    return mf.SoftmaxAttention(jnp.asarray(V), A=jnp.asarray(A))


@pytest.mark.parametrize("scheme", [None, "sphere", "pre-ln", "peri-ln", "ngpt"])
def test_each_scheme_matches_an_independent_solve(scheme):
    ts = np.linspace(0.0, 3.0, 7)
    start = _unit(X0) if scheme in ("sphere", "ngpt") else X0
    ref = solve_ivp(
        lambda t, y: _field(y.reshape(N, D), scheme).ravel(),
        (0, 3),
        start.ravel(),
        t_eval=ts,
        method="DOP853",
        rtol=1e-12,
        atol=1e-12,
    )
    sol = mf.simulate(
        mf.Particles(jnp.asarray(X0)),
        _attn(),
        3.0,
        saveat=ts,
        normalization=scheme,
        ngpt_alpha=ALPHA,
        rtol=1e-11,
        atol=1e-11,
    )
    assert sol.status == "success"
    want = ref.y.T.reshape(len(ts), N, D)
    np.testing.assert_allclose(sol.x, want, rtol=0, atol=1e-8)
    if scheme in ("sphere", "ngpt"):
        np.testing.assert_allclose(np.linalg.norm(sol.x, axis=-1), 1, atol=1e-13)
    if scheme == "pre-ln":  # the free residual stream grows
        assert np.all(np.linalg.norm(sol.x[-1], axis=-1) > 0)


@pytest.mark.parametrize("scheme", [None, "sphere", "pre-ln", "peri-ln", "ngpt"])
def test_layers_are_the_residual_blocks(scheme):
    L, t1 = 12, 3.0
    x = _unit(X0) if scheme in ("sphere", "ngpt") else X0
    want = [x]
    for _ in range(L):
        x = _block(x, t1 / L, scheme)
        want.append(x)
    sol = mf.layers(
        mf.Particles(jnp.asarray(X0)),
        _attn(),
        L,
        t1=t1,
        normalization=scheme,
        ngpt_alpha=ALPHA,
    )
    np.testing.assert_allclose(sol.x, np.array(want), rtol=0, atol=1e-12)


def test_ngpt_blocks_converge_to_the_flow_at_first_order():
    """The nGPT block is not an Euler step of its flow, yet converges to it.

    The flow is derived in docs/math/particles.md.
    """
    flow = mf.simulate(
        mf.Particles(jnp.asarray(X0)),
        _attn(),
        2.0,
        normalization="ngpt",
        ngpt_alpha=ALPHA,
        rtol=1e-12,
        atol=1e-12,
    ).x[-1]
    errors = [
        float(
            np.max(
                np.abs(
                    mf.layers(
                        mf.Particles(jnp.asarray(X0)),
                        _attn(),
                        L,
                        t1=2.0,
                        normalization="ngpt",
                        ngpt_alpha=ALPHA,
                    ).x[-1]
                    - flow
                )
            )
        )
        for L in (200, 400)
    ]
    assert errors[0] < 1e-2
    assert errors[0] / errors[1] == pytest.approx(2.0, rel=0.05)


def test_zero_tokens_are_rejected_by_every_scheme():
    x = np.array(X0)
    x[2] = 0
    for scheme in ("sphere", "pre-ln", "peri-ln", "ngpt"):
        with pytest.raises(ValueError, match="zero token"):
            mf.simulate(mf.Particles(x), _attn(), 1.0, normalization=scheme)
    with pytest.raises(ValueError, match="normalization"):
        mf.simulate(mf.Particles(X0), _attn(), 1.0, normalization="post-ln")
