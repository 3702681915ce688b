"""Small blow-up studies: the queue sized to the chunk classifies as 256 slots do.

`mf.gaussian.blowup_times` steps sqrt(runs) slots together by default (a power of
two in [32, 256], `queue_slots`); a run's solve does not depend on the runs that
share the queue, so the verdicts, times, ranks and rates must be those of the
former fixed 256 slots up to the rounding of a wider vectorised step.
"""

import jax
import jax.numpy as jnp
import jax.random as jr
import numpy as np
import pytest

import meanfield as mf
from meanfield import _status
from meanfield.gaussian._study import queue_slots

# A d = 2 softmax run that settles at a steady rank-one Sigma (lambda_max ~ 7.8e4):
# the explicit pass spends its budget, the implicit (RODAS) pass classifies it
# (as in tests/test_gaussian_study.py), so the study's second pass is compared too.
A_CRAWL = np.array([[-0.3761, -1.1723], [0.0471, 1.6095]])
V_CRAWL = np.array([[1.1805, 0.2875], [-0.2047, 1.2775]])

VARIANTS = {
    "softmax": lambda A, V: mf.SoftmaxAttention(V, A=A),
    "l2": lambda A, V: mf.L2Attention(V, Q=A, K=jnp.eye(A.shape[0])),
    "sinkhorn": lambda A, V: mf.SinkhornAttention(V, A=A),
}


def test_queue_slots_follow_the_square_root_of_the_chunk():
    runs = [1, 100, 1000, 4000, 10_000, 50_000, 65_536, 10**6]
    assert [queue_slots(n) for n in runs] == [32, 32, 32, 64, 128, 256, 256, 256]


def _study(key, variant, n, **options):
    # The benchmark's draw (benchmarks/gaussian_blowup.py): A ~ N(0, 1/d),
    # V = I + N(0, 0.1/d), Sigma0 = I, t_max = 5; plus the crawling run.
    d = 2
    ka, kv = jr.split(key)
    As = np.asarray(jr.normal(ka, (n - 1, d, d))) / np.sqrt(d)
    Vs = np.eye(d) + np.asarray(jr.normal(kv, (n - 1, d, d))) * np.sqrt(0.1 / d)
    As, Vs = np.concatenate([As, A_CRAWL[None]]), np.concatenate([Vs, V_CRAWL[None]])
    attns = {variant: jax.vmap(VARIANTS[variant])(jnp.asarray(As), jnp.asarray(Vs))}
    gauss = mf.Gaussian(np.zeros(d), np.eye(d))
    return mf.gaussian.blowup_times(gauss, attns, 5.0, **options)


@pytest.mark.slow  # three study programs compiled twice each (~25 s on 2 cores)
@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_sized_queue_matches_256_slots(key, variant):
    n = 300  # 32 slots by default against 256 (all 300 runs at once)
    new = _study(key, variant, n)
    old = _study(key, variant, n, slots=256, chunk_size=65_536)
    np.testing.assert_array_equal(new.status[variant], old.status[variant])
    np.testing.assert_array_equal(new.rank[variant], old.rank[variant])
    # Each run's steps are those of its own solve; only the width of the
    # vectorised step differs, which may move the last digits of a state. The
    # solve holds each step to rtol = 1e-8, so 1e-6 leaves room for the
    # accumulation over the steps without hiding a changed trajectory.
    for got, want in (
        (new.times[variant], old.times[variant]),
        (new.rate[variant], old.rate[variant]),
    ):
        np.testing.assert_array_equal(np.isfinite(got), np.isfinite(want))
        np.testing.assert_allclose(got, want, rtol=1e-6, atol=0)
    if variant == "softmax":  # the crawling run reached the implicit pass
        assert new.status[variant][-1] == _status.STATIONARY
