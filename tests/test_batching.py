"""Per-run maps that keep batched LAPACK calls below jaxlib 0.10's fan-out.

jaxlib 0.10 splits a batched LAPACK call of 2e5 estimated flops or more into
tasks on XLA's intra-op pool and blocks the calling worker; with every worker
such a caller the program hangs (it did: 1000 L2 runs in d = 8 on 2 cores).
The study's compiled program is checked for the cause, not for the hang: every
LAPACK custom call in it must be small enough to run inline.
"""

import re

import equinox as eqx
import jax
import jax.numpy as jnp
import jax.random as jr
import numpy as np
import pytest

import meanfield as mf
from meanfield._batching import inline_batch, map_runs, safe_batch
from meanfield.gaussian import _study


def test_inline_batch_stays_under_the_fan_out_threshold():
    for m in (1, 2, 4, 8, 16, 27, 58, 67, 200):
        b = inline_batch(m)
        assert b >= 1
        # 10 m^3 is jaxlib's largest per-matrix cost estimate; b + 1 would reach it.
        assert b == 1 or b * 10 * m**3 < 200_000 <= (b + 1) * 10 * m**3


def test_safe_batch_finds_lapack_calls_wherever_they_are():
    x = jnp.zeros((1000, 8, 8))
    assert safe_batch(lambda a: a @ a + 1, x) is None  # no LAPACK: one vmap
    assert safe_batch(lambda a: jnp.linalg.eigh(a)[0], x) == inline_batch(8)
    # Inside a cond branch and a nested jit, and the largest matrix decides.
    nested = jax.jit(
        lambda a: jax.lax.cond(a[0, 0] > 0, jnp.linalg.inv, lambda b: b, a)
    )
    assert safe_batch(nested, x) == inline_batch(8)
    assert safe_batch(lambda a: jnp.linalg.det(jnp.kron(a, a)), x) == inline_batch(64)
    # A call that already batches 5 problems per run leaves a fifth of the runs.
    stack = lambda a: jnp.linalg.eigh(jnp.stack([a] * 5))[0]  # noqa: E731
    assert safe_batch(stack, x) == inline_batch(8) // 5
    # Derivatives count too (RODAS's Jacobian of a field that solves).
    jac = jax.jacfwd(lambda a: jnp.linalg.solve(a, a[0]))
    assert safe_batch(jac, x) == inline_batch(8)


@pytest.mark.parametrize("batch", [1, 7, 40, 100])
def test_map_runs_matches_vmap(batch):
    """Chunks with a remainder (40 runs: 5 x 7 + 5) give vmap's values exactly."""
    x = jr.normal(jr.key(0), (40, 5, 5))
    y = jr.normal(jr.key(1), (40, 5))

    def one(a, v):
        lam, vecs = jnp.linalg.eigh(a + a.T)
        return {"lam": lam, "solve": jnp.linalg.solve(a, v), "dot": vecs @ v}

    got = map_runs(one, x, y, batch=batch)
    want = jax.vmap(one)(x, y)
    for key in want:
        np.testing.assert_allclose(got[key], want[key], rtol=1e-13, atol=1e-13)


def _lapack_calls(text):
    """(target, batch, m) of every batched LAPACK custom call in StableHLO text."""
    calls = []
    for line in text.splitlines():
        target = re.search(r"custom_call @(lapack_\w+)", line)
        if target:
            shape = re.search(r":\s*\(tensor<(\d+)x(\d+)x(\d+)x", line)
            if shape:
                calls.append(
                    (target.group(1), int(shape.group(1)), int(shape.group(2)))
                )
    return calls


@pytest.mark.parametrize(
    "family",
    [
        lambda A, V: mf.L2Attention(V, Q=A, K=jnp.eye(A.shape[0])),
        lambda A, V: mf.SoftmaxAttention(V, A=A),
        lambda A, V: mf.SinkhornAttention(V, A=A),
    ],
    ids=["l2", "softmax", "sinkhorn"],
)
def test_study_program_runs_every_lapack_call_inline(family):
    """d = 8, 1000 runs: the batches that hung (1000 x 8 x 8 summaries, RODAS's
    32 x 67 x 67 LU) are split into inline-sized chunks."""
    d, n = 8, 1000
    As = jr.normal(jr.key(2), (n, d, d)) / np.sqrt(d)
    Vs = jnp.eye(d)[None] + 0.1 * jr.normal(jr.key(3), (n, d, d))
    batched = jax.vmap(family)(As, Vs)
    arrays, static = eqx.partition(batched, eqx.is_array)
    first = jax.tree.map(lambda a: a[0] if eqx.is_array(a) else a, batched)
    settings = dict(
        t0=0.0,
        t_max=5.0,
        log_threshold=36.8,
        stationary_tol=1e-6,
        rank_rtol=1e-3,
        rtol=1e-8,
        atol=1e-10,
    )
    text = _study.classify.lower(
        arrays,
        static,
        jnp.eye(d),
        **{k: jnp.asarray(v, jnp.float64) for k, v in settings.items()},
        slots=256,
        max_steps=4000,
        frame_only=_study._needs_frame(first, 0.0, d),
    ).as_text()
    calls = _lapack_calls(text)
    assert calls, "the study should factorise something (eigh of the summaries)"
    for target, batch, m in calls:
        assert batch <= inline_batch(m), (target, batch, m)
