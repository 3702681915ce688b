"""Blocked (online-softmax) kernels: equal to the dense ones, O(n) memory, and the
particle axis sharded over 4 simulated CPU devices."""

import os
import subprocess
import sys
import textwrap

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import meanfield as mf
from meanfield._kernels import blocked as _blocked

# n = 101 queries/keys against blocks of 24: n is not a multiple of the block.
N, D, BLOCK = 101, 3, 24


def _families(rng, blocking):
    A, V = 0.5 * rng.normal(size=(D, D)), rng.normal(size=(D, D))
    Q, K = 0.5 * rng.normal(size=(2, D)), 0.5 * rng.normal(size=(2, D))
    kw = dict(blocking=blocking, block_size=BLOCK)
    return {
        "softmax": mf.SoftmaxAttention(V, A=A, **kw),
        "softmax_QK": mf.SoftmaxAttention(V, Q=Q, K=K, **kw),
        "l2": mf.L2Attention(V, Q=Q, K=K, **kw),
        "multihead": mf.MultiHeadAttention(
            [mf.SoftmaxAttention(V, A=A, **kw), mf.L2Attention(V.T, Q=Q, K=K, **kw)],
            out=[np.eye(D), 0.5 * np.eye(D)],
        ),
        "sinkhorn": mf.SinkhornAttention(V, A=A, tol=1e-12, **kw),
        "sinkhorn_l2": mf.SinkhornAttention(V, Q=Q, K=K, kernel="l2", tol=1e-12, **kw),
    }


def _measures(rng):
    x = rng.normal(size=(N, D))
    w = rng.random(N) + 0.05
    w /= w.sum()
    s = np.sort(rng.random(N))  # sorted: masked key blocks are skipped
    return {
        "uniform": mf.Particles(x),
        "weighted": mf.Particles(x, w),
        "masked": mf.MaskedParticles(x, s, w),
    }


# Sinkhorn rejects masked measures and is the slowest family (implicit adjoint): its
# dot kernel runs on uniform weights, its l2 kernel on weights.
CASES = [
    (family, measure)
    for family in ("softmax", "softmax_QK", "l2", "multihead", "sinkhorn")
    for measure in ("uniform", "weighted", "masked")
    if not (family == "sinkhorn" and measure != "uniform")
] + [("sinkhorn_l2", "weighted")]


@pytest.mark.parametrize(("family", "measure"), CASES)
def test_blocked_equals_dense_with_gradients(family, measure):
    rng = np.random.default_rng(0)
    dense = _families(rng, "dense")[family]
    blocked = _families(np.random.default_rng(0), "blocked")[family]
    mu = _measures(rng)[measure]
    # Same sums in another order: rounding only (Sinkhorn: its tol 1e-12 too).
    np.testing.assert_allclose(blocked.velocity(mu), dense.velocity(mu), atol=1e-12)

    def loss(attn):
        def f(x):
            return jnp.sum(jnp.sin(attn.velocity(eqx.tree_at(lambda m: m.x, mu, x))))

        return f

    g_dense = jax.grad(loss(dense))(mu.x)
    g_blocked = jax.grad(loss(blocked))(mu.x)
    # Sinkhorn's implicit adjoint: dense LU against GMRES at rtol 1e-10.
    atol = 1e-9 if family.startswith("sinkhorn") else 1e-12
    np.testing.assert_allclose(g_blocked, g_dense, atol=atol)


def test_blocked_queries_differ_from_keys_and_empty_rows():
    rng = np.random.default_rng(1)
    q, k = rng.normal(size=(37, 4)), rng.normal(size=(53, 4))
    b, v = rng.normal(size=53), rng.normal(size=(53, 2))
    qp, kp = rng.random(37), rng.random(53)
    qp[0] = -1.0  # sees no key: velocity 0, as the dense kernel defines it
    from meanfield._kernels import dense as _kernels

    dense = _kernels.softmax_average(
        _kernels.logits(q, k, b), v, _kernels.causal_mask(qp, kp)
    )
    out = _blocked.softmax_average(q, k, b, v, qp, kp, block_q=8, block_k=10)
    np.testing.assert_allclose(out, dense, atol=1e-13)
    assert np.all(np.asarray(out[0]) == 0)


def test_auto_switches_to_blocked_by_size():
    from meanfield._attention.base import AUTO_BLOCKED_PAIRS, use_blocked

    assert not use_blocked("auto", 2048, 2048)
    assert use_blocked("auto", 2049, 2048) and 2049 * 2048 > AUTO_BLOCKED_PAIRS
    assert use_blocked("blocked", 2, 2) and not use_blocked("dense", 10**6, 10**6)
    with pytest.raises(ValueError, match="`blocking` must be one of"):
        mf.SoftmaxAttention(np.eye(2), A=np.eye(2), blocking="tiled")
    with pytest.raises(ValueError, match="`block_size` must be an integer >= 1"):
        mf.L2Attention(np.eye(2), Q=np.eye(2), K=np.eye(2), block_size=0)


@pytest.mark.parametrize("masked", [False, True])
def test_blocked_memory_stays_small_where_dense_needs_gigabytes(masked):
    # n = 65536, d = 16, float32: the dense logits alone are n^2 * 4 B = 16 GiB.
    n, d = 65536, 16
    x = jax.ShapeDtypeStruct((n, d), jnp.float32)
    s = jax.ShapeDtypeStruct((n,), jnp.float32)

    def memory(blocking, grad=False):
        attn = mf.SoftmaxAttention(jnp.eye(d), A=jnp.eye(d), blocking=blocking)

        def vel(x, s):
            mu = mf.MaskedParticles(x, s) if masked else mf.Particles(x)
            return attn.velocity(mu)

        f = jax.grad(lambda x, s: jnp.sum(vel(x, s) ** 2)) if grad else vel
        stats = jax.jit(f).lower(x, s).compile().memory_analysis()
        return stats.temp_size_in_bytes

    # The dense reference: its gradient keeps the n x n weights (32 GiB), and a
    # masked forward its n x n mask. (XLA's CPU backend streams the unmasked dense
    # forward by itself, in 12 MiB; that is XLA's fusion, not a guarantee.)
    assert memory("dense", grad=True) > 4 * 2**30
    if masked:
        assert memory("dense") > 4 * 2**30
    # O(n block + n d), 2048 x 512 tiles: measured 21 MiB (forward) and 71-130 MiB
    # (gradient: the checkpointed key-block carries of one query lane per step).
    assert memory("blocked") < 64 * 2**20
    assert memory("blocked", grad=True) < 256 * 2**20


SHARDED_SCRIPT = textwrap.dedent(
    """
    import jax
    jax.config.update("jax_enable_x64", True)
    import jax.numpy as jnp
    import numpy as np
    import meanfield as mf

    assert jax.device_count() == 4
    rng = np.random.default_rng(0)
    n, d = 512, 3
    x = rng.normal(size=(n, d))
    w = rng.random(n) + 0.1
    w /= w.sum()
    s = np.sort(rng.random(n))
    A, V = 0.3 * rng.normal(size=(d, d)), -np.eye(d)
    for blocking in ("dense", "blocked"):
        attn = mf.SoftmaxAttention(V, A=A, blocking=blocking, block_size=64)
        vel = jax.jit(lambda m: attn.velocity(m))
        for mu in (mf.Particles(x, w), mf.MaskedParticles(x, s, w)):
            sharded = mf.shard(mu)
            assert len(sharded.x.sharding.device_set) == 4
            out = vel(sharded)
            assert out.sharding.spec[0] == "particles", out.sharding
            err = float(jnp.max(jnp.abs(out - vel(mu))))
            assert err < 1e-13, (blocking, err)
        ts = jnp.linspace(0.0, 1.0, 3)
        one = mf.simulate(mf.Particles(x, w), attn, 1.0, saveat=ts)
        four = mf.simulate(mf.shard(mf.Particles(x, w)), attn, 1.0, saveat=ts)
        assert four.status == "success"
        assert len(four.x.sharding.device_set) == 4
        err = float(jnp.max(jnp.abs(four.x - one.x)))
        assert err < 1e-12, (blocking, err)
    print("ok")
    """
)


# Second tier (make test-slow): a 4-device subprocess, 44 s of compiles on 2 cores.
@pytest.mark.slow
def test_sharded_velocity_and_simulate_match_single_device():
    # A fresh process: the device count is fixed when jax initialises.
    env = dict(os.environ, XLA_FLAGS="--xla_force_host_platform_device_count=4")
    env["JAX_PLATFORMS"] = "cpu"
    out = subprocess.run(
        [sys.executable, "-c", SHARDED_SCRIPT],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.strip().endswith("ok")


def test_shard_rejects_uneven_particle_counts():
    if jax.device_count() > 1:
        pytest.skip("single-device process expected")
    mu = mf.Particles(np.zeros((3, 2)))
    # One device divides every n: the measure comes back unchanged.
    np.testing.assert_array_equal(mf.shard(mu).x, mu.x)
    with pytest.raises(ValueError, match="must be Particles"):
        mf.shard(mf.Gaussian(np.zeros(2), np.eye(2)))
