"""The fused (Pallas) softmax average, in Pallas' interpret mode on the CPU.

On a GPU the same kernel compiles through Triton (benchmarks/accelerator.py times
and checks it there); here it runs as XLA operations, which checks the program:
tiles, padding, the online softmax, masks, empty rows, bf16 products, vmap, and
derivatives (taken through the blocked kernel).
"""

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from helpers import normalised_velocity_numpy

import meanfield as mf
from meanfield._kernels import dense as _dense
from meanfield._kernels import fused as _fused


def _problem(rng, n=37, m=53, k=3, dv=5):
    q, keys = rng.normal(size=(n, k)), rng.normal(size=(m, k))
    bias, values = rng.normal(size=m), rng.normal(size=(m, dv))
    bias[[4, 20]] = -np.inf  # removed keys (zero weight)
    return q, keys, bias, values


def _reference(q, keys, bias, values, qp=None, kp=None):
    mask = None if qp is None else _dense.causal_mask(qp, kp)
    return _dense.softmax_average(_dense.logits(q, keys, bias), values, mask)


@pytest.mark.parametrize(("block_q", "block_k"), [(16, 16), (16, 32), (64, 16)])
def test_fused_equals_dense_in_float64(block_q, block_k):
    # 37 queries and 53 keys: neither a multiple of the tiles; k = 3 and dv = 5
    # are padded to 16 features.
    q, keys, bias, values = _problem(np.random.default_rng(0))
    out = _fused.softmax_average(
        q, keys, bias, values, block_q=block_q, block_k=block_k
    )
    assert out.shape == (37, 5) and out.dtype == jnp.float64
    np.testing.assert_allclose(out, _reference(q, keys, bias, values), atol=1e-14)


def test_fused_causal_mask_and_queries_that_see_nothing():
    rng = np.random.default_rng(1)
    q, keys, bias, values = _problem(rng)
    qp, kp = rng.random(37), rng.random(53)
    qp[0] = -1.0  # sees no key: 0, as the dense kernel defines it
    out = _fused.softmax_average(q, keys, bias, values, qp, kp, block_q=16)
    np.testing.assert_allclose(
        out, _reference(q, keys, bias, values, qp, kp), atol=1e-14
    )
    assert np.all(np.asarray(out[0]) == 0)


def test_fused_float32_and_bf16_products():
    q, keys, bias, values = _problem(np.random.default_rng(2))
    ref = np.asarray(_reference(q, keys, bias, values))
    scale = np.max(np.abs(ref))
    f32 = [jnp.asarray(a, jnp.float32) for a in (q, keys, bias, values)]
    out = _fused.softmax_average(*f32)
    assert out.dtype == jnp.float32
    # float32 sums of ~50 terms of O(1): a few ulps of max |v|.
    assert np.max(np.abs(out - ref)) / scale < 2e-6
    half = _fused.softmax_average(*f32, compute_dtype="bfloat16")
    # bf16 inputs to both products (8-bit significands: 2^-9 relative rounding
    # of logits O(3) and values), float32 accumulation: ~1e-2, not float32's 1e-6.
    err = np.max(np.abs(half - ref)) / scale
    assert 1e-4 < err < 3e-2


def test_fused_under_vmap_and_jit():
    rng = np.random.default_rng(3)
    q, keys, bias, values = _problem(rng)
    qs = np.stack([q, 2 * q, -q])
    out = jax.jit(jax.vmap(lambda a: _fused.softmax_average(a, keys, bias, values)))(qs)
    for i in range(3):
        np.testing.assert_allclose(
            out[i], _reference(qs[i], keys, bias, values), atol=1e-14
        )


def test_attention_families_run_fused_with_gradients():
    rng = np.random.default_rng(4)
    d, n = 3, 29
    x, w = rng.normal(size=(n, d)), rng.random(n) + 0.1
    A, V = 0.5 * rng.normal(size=(d, d)), rng.normal(size=(d, d))
    Q, K = 0.5 * rng.normal(size=(2, d)), 0.5 * rng.normal(size=(2, d))
    s = np.sort(rng.random(n))
    mu = mf.MaskedParticles(x, s, w / w.sum())

    def velocity(attn):
        return attn.velocity(mu)

    for make in (
        lambda b: mf.SoftmaxAttention(V, A=A, blocking=b),
        lambda b: mf.L2Attention(V, Q=Q, K=K, blocking=b),
    ):
        fused, dense = make("fused"), make("dense")
        np.testing.assert_allclose(velocity(fused), velocity(dense), atol=1e-13)

        def loss(attn):
            return lambda y: jnp.sum(
                jnp.sin(attn.velocity(eqx.tree_at(lambda m: m.x, mu, y)))
            )

        np.testing.assert_allclose(
            jax.grad(loss(fused))(mu.x), jax.grad(loss(dense))(mu.x), atol=1e-12
        )
    # Against the double loop, for the weighted masked softmax.
    want = normalised_velocity_numpy(
        x,
        x,
        w / w.sum(),
        V,
        lambda a, b: float(np.dot(A @ a, b)),
        query_pos=s,
        key_pos=s,
    )
    got = mf.SoftmaxAttention(V, A=A, blocking="fused").velocity(mu)
    np.testing.assert_allclose(got, want, atol=1e-13)


# 10 s in interpret mode on 2 cores: in the second tier.
@pytest.mark.slow
def test_simulate_and_lipschitz_with_the_fused_kernel():
    rng = np.random.default_rng(5)
    x = rng.normal(size=(24, 3))
    x /= np.linalg.norm(x, axis=1, keepdims=True)
    runs = {}
    for blocking in ("fused", "dense"):
        attn = mf.SoftmaxAttention(np.eye(3), A=3 * np.eye(3), blocking=blocking)
        sol = mf.simulate(mf.Particles(x), attn, 2.0, normalization="sphere")
        lip = mf.lipschitz.local(attn, x)
        runs[blocking] = (sol, lip)
    (sol_f, lip_f), (sol_d, lip_d) = runs["fused"], runs["dense"]
    assert sol_f.status == "success" and int(sol_f.num_steps) == int(sol_d.num_steps)
    np.testing.assert_allclose(sol_f.x, sol_d.x, atol=1e-12)
    assert bool(lip_f.converged)
    assert float(lip_f.value) == pytest.approx(float(lip_d.value), rel=1e-10)


def test_fused_rejects_bad_options():
    q, keys, bias, values = _problem(np.random.default_rng(6))
    with pytest.raises(ValueError, match="`block_q` must be a power of two >= 16"):
        _fused.softmax_average(q, keys, bias, values, block_q=24)
    with pytest.raises(ValueError, match="`block_k` must be a power of two >= 16"):
        _fused.softmax_average(q, keys, bias, values, block_k=8)
    with pytest.raises(ValueError, match="`compute_dtype` must be None or"):
        _fused.softmax_average(q, keys, bias, values, compute_dtype="float16")
    with pytest.raises(ValueError, match="give both `query_pos` and `key_pos`"):
        _fused.softmax_average(q, keys, bias, values, np.zeros(37))
    with pytest.raises(ValueError, match="`blocking` must be one of"):
        mf.SinkhornAttention(np.eye(2), A=np.eye(2), blocking="fused")


def test_fused_logit_scale_and_huge_tokens():
    # Features divided by c = 2^k give logits / c^2; the kernel multiplies the
    # max-shifted logits back, as the blocked kernel does.
    q, keys, bias, values = _problem(np.random.default_rng(7))
    c = 8.0
    want = _reference(q, keys, bias, values)
    out = _fused.softmax_average(
        q / c, keys / c, bias / c**2, values, block_q=16, logit_scale=c
    )
    np.testing.assert_allclose(out, want, atol=1e-13)
    # Through the attention, tokens whose logits overflow float64 (|x|^2 ~ 1e310).
    x = np.random.default_rng(8).normal(size=(20, 2)) * 1e155
    mu = mf.Particles(x)
    fused = mf.SoftmaxAttention(np.eye(2), A=np.eye(2), blocking="fused")
    dense = mf.SoftmaxAttention(np.eye(2), A=np.eye(2), blocking="dense")
    got, ref = fused.velocity(mu), dense.velocity(mu)
    assert np.all(np.isfinite(got))
    np.testing.assert_allclose(got, ref, rtol=1e-13)


def test_attention_fused_path_is_the_pallas_kernel(monkeypatch):
    # "fused" must reach the Pallas kernel (not fall back to the blocked one).
    calls = []
    real = _fused.softmax_average
    monkeypatch.setattr(
        _fused, "softmax_average", lambda *a, **k: calls.append(1) or real(*a, **k)
    )
    attn = mf.SoftmaxAttention(np.eye(2), A=np.eye(2), blocking="fused")
    attn.velocity(mf.Particles(np.ones((5, 2))))
    assert calls == [1]
