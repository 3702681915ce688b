"""`mf.lipschitz` on the Transformer fields: positional and hardmax attention,
feed-forward layers and blocks.

`local` only differentiates `velocity`, so its value is checked against the
singular values of the dense Jacobian; the Jacobian of a block is checked
against the attention's plus the feed-forward layer's, formed in NumPy.
"""

import math

import equinox as eqx
import jax
import numpy as np
import pytest

import meanfield as mf
from meanfield.lipschitz._local import token_dim

L = mf.lipschitz
N, D = 12, 4  # d even: RoPE rotates pairs of coordinates
# Residual tolerance of `local`: some singular value s of the map has
# |s^2 - rho| <= TOL rho, so the value sqrt(rho) is within TOL / 2 of s.
TOL = 1e-10


def _params(seed=0):
    rng = np.random.default_rng(seed)
    return {
        "A": rng.normal(size=(D, D)) / 2,
        "V": rng.normal(size=(D, D)),
        "Q": rng.normal(size=(D, D)) / 2,
        "K": rng.normal(size=(D, D)) / 2,
        "W": rng.normal(size=(D, D)),
        "b": rng.normal(size=D),
        "W1": rng.normal(size=(6, D)),
        "b1": rng.normal(size=6),
        "W2": rng.normal(size=(D, 6)) / 2,
        "b2": rng.normal(size=D),
    }


def _fields(p):
    softmax = mf.SoftmaxAttention(p["V"], A=p["A"])
    mlp = mf.MLP(p["W1"], p["b1"], p["W2"], p["b2"], activation="gelu")
    return {
        "block_affine": mf.Block(softmax, mf.FeedForward(p["W"], p["b"])),
        "block_mlp_gelu": mf.Block(softmax, mlp),
        "feedforward": mf.FeedForward(p["W"], p["b"]),
        "mlp_gelu": mlp,
        "alibi": mf.ALiBiAttention(p["V"], A=p["A"], slope=3.0),
        "rope": mf.RoPEAttention(
            p["V"], Q=p["Q"], K=p["K"], frequencies=np.array([2.0, 7.0])
        ),
        "hardmax": mf.HardmaxAttention(p["V"], A=p["A"]),
    }


# Positional families need positions; the others run both ways.
CASES = [
    (name, masked)
    for name in _fields(_params())
    for masked in (False, True)
    if masked or name not in ("alibi", "rope")
]


def _inputs(masked, weighted, seed=1):
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(N, D))
    positions = rng.permutation(N) / N if masked else None
    weights = None
    if weighted:
        weights = rng.random(N) + 0.1
        weights /= weights.sum()
    return x, positions, weights


def dense_jacobian(field, x, positions=None, weights=None):
    """The (n d, n d) Jacobian of X -> velocity, by jax.jacfwd."""
    if positions is None:
        measure = mf.Particles(x, weights)
    else:
        measure = mf.MaskedParticles(x, positions, weights)

    def f(y):
        return field.velocity(eqx.tree_at(lambda m: m.x, measure, y))

    return np.asarray(jax.jacfwd(f)(measure.x)).reshape(N * D, N * D)


def dense_lipschitz(field, x, positions=None, weights=None):
    """sigma_max(diag(sqrt w) J diag(1/sqrt w)), the weighted norm of `local`."""
    J = dense_jacobian(field, x, positions, weights)
    sw = np.ones(N * D) if weights is None else np.repeat(np.sqrt(weights), D)
    return np.linalg.svd(sw[:, None] * J / sw[None, :], compute_uv=False)[0]


@pytest.mark.parametrize(("name", "masked"), CASES)
@pytest.mark.parametrize("weighted", [False, True])
def test_local_is_the_top_singular_value_of_the_dense_jacobian(name, masked, weighted):
    field = _fields(_params())[name]
    x, positions, weights = _inputs(masked, weighted)
    res = L.local(field, x, positions=positions, weights=weights, tol=TOL)
    assert bool(res.converged)
    ref = dense_lipschitz(field, x, positions, weights)
    # Krylov-Bogoliubov with the residual TOL (above), plus rounding of J.
    np.testing.assert_allclose(float(res), ref, rtol=TOL)


@pytest.mark.parametrize("weighted", [False, True])
def test_affine_feedforward_alone_has_constant_the_norm_of_w(weighted):
    # f(X)_i = W x_i + b: J = I_n (x) W, and diag(sqrt w) (x) I commutes with it.
    p = _params()
    x, _, weights = _inputs(False, weighted)
    res = L.local(mf.FeedForward(p["W"], p["b"]), x, weights=weights, tol=TOL)
    assert bool(res.converged)
    np.testing.assert_allclose(float(res), np.linalg.norm(p["W"], 2), rtol=TOL)


def _gelu_derivative(u):
    # d/du u Phi(u) = Phi(u) + u phi(u), Phi the standard normal cdf (erf form).
    cdf = 0.5 * (1 + np.vectorize(math.erf)(u / math.sqrt(2)))
    return cdf + u * np.exp(-(u**2) / 2) / math.sqrt(2 * math.pi)


def _block_diagonal(blocks):
    out = np.zeros((N * D, N * D))
    for i, block in enumerate(blocks):
        out[i * D : (i + 1) * D, i * D : (i + 1) * D] = block
    return out


@pytest.mark.parametrize("masked", [False, True])
def test_block_jacobian_is_attention_plus_feedforward(masked):
    p = _params()
    x, positions, weights = _inputs(masked, True)
    fields = _fields(p)
    attention = fields["block_affine"].attention
    J_attn = dense_jacobian(attention, x, positions, weights)
    # Affine: blockdiag(W, ..., W).
    J = dense_jacobian(fields["block_affine"], x, positions, weights)
    expected = J_attn + _block_diagonal([p["W"]] * N)
    np.testing.assert_allclose(J, expected, rtol=0, atol=1e-12)
    # GELU perceptron: blocks W2 diag(gelu'(W1 x_i + b1)) W1.
    J = dense_jacobian(fields["block_mlp_gelu"], x, positions, weights)
    hidden = x @ p["W1"].T + p["b1"]
    blocks = [p["W2"] @ (g[:, None] * p["W1"]) for g in _gelu_derivative(hidden)]
    np.testing.assert_allclose(J, J_attn + _block_diagonal(blocks), rtol=0, atol=1e-12)


def test_token_dim_of_feedforward_fields_and_blocks():
    for field in _fields(_params()).values():
        assert token_dim(field) == D


@pytest.mark.parametrize("name", list(_fields(_params())))
def test_bounds_without_a_formula_are_inf_or_a_clear_error(name):
    field = _fields(_params())[name]
    # The mean-field bound needs every head's kernel constants: none here.
    assert float(L.meanfield_bound(field, 1.0)) == math.inf
    feedforward = name.startswith(("block", "feedforward", "mlp"))
    what = "feed-forward field" if feedforward else f"{type(field).__name__} head"
    with pytest.raises(ValueError, match=f"`upper_bound` is proved .* {what}"):
        L.upper_bound(field, N, 1.0)
    with pytest.raises(ValueError, match="needs a single SoftmaxAttention head"):
        L.adversarial(field, N, 1.0)
