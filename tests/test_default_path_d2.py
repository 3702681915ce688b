"""The default large-n path ("auto" above 2048^2 pairs, few features): the kernel of
bounded logits (`_kernels.bounded`), its fallback to the online softmax, gradients
and vmap, against naive O(n^2) NumPy."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import meanfield as mf
from meanfield._kernels import blocked as _blocked
from meanfield._kernels import bounded as _bounded

# 2304^2 > 2048^2 pairs: "auto" leaves the dense kernel.
N = 2304


def _naive(z, x, w, V, A=None, Q=None, K=None):
    """Gamma(z_i) in float64 NumPy: the (m, n) logits, max-shifted softmax."""
    z, x, w, V = (np.asarray(a, np.float64) for a in (z, x, w, V))
    q = z @ (np.asarray(A, np.float64).T if A is not None else (K.T @ Q).T)
    with np.errstate(divide="ignore"):  # log 0 = -inf: a removed atom
        logits = q @ x.T + np.log(w)[None, :]
    p = np.exp(logits - logits.max(axis=1, keepdims=True))
    return (p @ (x @ V.T)) / p.sum(axis=1, keepdims=True)


def _problem(n, d=2, seed=0):
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(n, d))
    w = rng.random(n) + 0.05
    w[::7] = 0  # zero weights: -inf biases
    return x, w / w.sum(), 0.5 * rng.normal(size=(d, d)), rng.normal(size=(d, d))


def _taken(q, keys, bias, values):
    """Which branch the kernel takes: the fallback here returns NaN."""
    out = _bounded.softmax_average(
        q, keys, bias, values, fallback=lambda: jnp.full(values.shape, jnp.nan)
    )
    return "bounded" if bool(jnp.all(jnp.isfinite(out))) else "fallback"


velocity = jax.jit(lambda mu, a: a.velocity(mu))


def test_default_path_matches_naive_float64():
    x, w, A, V = _problem(N)
    got = velocity(mf.Particles(x, w), mf.SoftmaxAttention(V, A=A))
    # float64, O(1) logits and values: rounding ~1e-14, so 1e-12 has margin.
    np.testing.assert_allclose(got, _naive(x, x, w, V, A), rtol=1e-12, atol=1e-12)
    bias = np.where(w > 0, np.log(np.where(w > 0, w, 1)), -np.inf)
    assert _taken(jnp.asarray(x @ A.T), x, jnp.asarray(bias), x @ V.T) == "bounded"


@pytest.mark.slow
def test_float32_matches_naive_to_float32_rounding():
    x, w, A, V = _problem(N, seed=1)
    f32 = [np.asarray(a, np.float32) for a in (x, w / w.sum(), A, V)]
    got = velocity(mf.Particles(f32[0], f32[1]), mf.SoftmaxAttention(f32[3], A=f32[2]))
    assert got.dtype == jnp.float32
    # float32 sums of ~2000 terms: ~1e-6 relative (the dense kernel's rounding).
    np.testing.assert_allclose(got, _naive(x, x, w, V, A), rtol=0, atol=2e-5)


@pytest.mark.slow
def test_queries_keys_and_features_of_other_sizes():
    # m = 2100 queries (not a multiple of the block), n = 4500 keys (two chunks of
    # 4096, the second padded), Q, K with k = 3 features.
    x, w, _, V = _problem(4500, seed=2)
    rng = np.random.default_rng(3)
    z = rng.normal(size=(2100, 2))
    Q, K = 0.5 * rng.normal(size=(3, 2)), 0.5 * rng.normal(size=(3, 2))
    at = jax.jit(lambda a, mu, z: a.velocity_at(mu, z))
    got = at(mf.SoftmaxAttention(V, Q=Q, K=K), mf.Particles(x, w), z)
    want = _naive(z, x, w, V, Q=Q, K=K)
    np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-12)


def test_large_logits_fall_back_to_the_online_softmax():
    # Unit tokens, A = 1000 I: |q_i| R = 1000 > the float64 limit (~650).
    rng = np.random.default_rng(4)
    theta = rng.uniform(0, 2 * np.pi, N)
    x = np.stack([np.cos(theta), np.sin(theta)], 1)
    w = np.full(N, 1 / N)
    A, V = 1000 * np.eye(2), np.array([[0.0, -1.0], [1.0, 0.0]])
    assert _bounded.logit_limit(jnp.float64, N) < 1000
    assert _taken(jnp.asarray(x @ A.T), x, jnp.zeros(N), x @ V.T) == "fallback"
    got = velocity(mf.Particles(x, w), mf.SoftmaxAttention(V, A=A))
    # Logits ~1e3: their rounding is ~1e-13 absolute, ~1e-10 on the weights.
    np.testing.assert_allclose(got, _naive(x, x, w, V, A), rtol=0, atol=1e-9)


@pytest.mark.slow
def test_kernel_equals_online_softmax_with_logit_scale():
    # c = 2^40: features divided by c, the logits c^2 <q, k> ~ O(1).
    rng = np.random.default_rng(5)
    q, k, v = (rng.normal(size=(300, 2)) * 2.0**-40 for _ in range(3))
    b = np.log(rng.random(300) + 0.1) * 2.0**-80
    c = jnp.asarray(2.0**40)
    assert _taken(q * 2.0**40, k * 2.0**40, b * 2.0**80, v) == "bounded"
    got = _bounded.softmax_average(
        q, k, b, v, fallback=lambda: jnp.full(v.shape, jnp.nan), logit_scale=c
    )
    want = _blocked.softmax_average(q, k, b, v, block_q=64, block_k=64, logit_scale=c)
    np.testing.assert_allclose(got, want, rtol=1e-12, atol=0)


@pytest.mark.slow
def test_gradient_matches_dense():
    x, w, A, V = _problem(N, seed=6)
    mu = mf.Particles(x, w)

    def loss(attn):
        return jax.grad(lambda x: jnp.sum(attn.velocity(mf.Particles(x, w)) ** 2))

    got = jax.jit(loss(mf.SoftmaxAttention(V, A=A)))(mu.x)
    want = jax.jit(loss(mf.SoftmaxAttention(V, A=A, blocking="dense")))(mu.x)
    # Both float64 autodiff of the same softmax: rounding ~1e-13 on O(1) entries.
    np.testing.assert_allclose(got, want, rtol=1e-10, atol=1e-10)


@pytest.mark.slow
def test_vmap_runs_both_branches_and_keeps_each_result():
    # Member 0 small logits (bounded kernel), member 1 large (fallback): under vmap
    # the `cond` is a select, so each member must still get its own branch's value.
    x, w, A, V = _problem(N, seed=7)
    x = x / np.linalg.norm(x, axis=1, keepdims=True)
    As = np.stack([A, 1000 * np.eye(2)])
    batched = jax.jit(
        jax.vmap(lambda A: mf.SoftmaxAttention(V, A=A).velocity(mf.Particles(x, w)))
    )(As)
    for member, A_ in enumerate(As):
        want = _naive(x, x, w, V, A_)
        np.testing.assert_allclose(batched[member], want, rtol=0, atol=1e-9)


@pytest.mark.parametrize("blocking", ["auto", "blocked", "dense"])
def test_only_auto_takes_the_bounded_kernel(blocking, monkeypatch):
    # "blocked" stays the online softmax, "dense" the dense kernel.
    calls = []
    kernel = _bounded.softmax_average
    monkeypatch.setattr(
        _bounded, "softmax_average", lambda *a, **k: calls.append(1) or kernel(*a, **k)
    )
    x, w, A, V = _problem(N, seed=8)
    attn = mf.SoftmaxAttention(V, A=A, blocking=blocking)
    jax.eval_shape(lambda mu: attn.velocity(mu), mf.Particles(x, w))
    assert len(calls) == (blocking == "auto")
    # Masked measures keep the online softmax under "auto" too.
    calls.clear()
    s = np.sort(np.random.default_rng(9).random(N))
    jax.eval_shape(lambda mu: attn.velocity(mu), mf.MaskedParticles(x, s, w))
    assert not calls
